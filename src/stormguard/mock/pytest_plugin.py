"""pytest plugin of stormguard (fixtures arrive with the mock server)."""
