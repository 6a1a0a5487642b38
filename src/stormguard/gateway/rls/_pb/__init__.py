"""Generated from the vendored Envoy protos (../protos); do not edit.

Regenerate with ``make rls-protos`` (tools/gen_rls_protos.py).
"""

try:
    import google.protobuf  # noqa: F401
except ImportError as exc:  # the generated modules need the protobuf runtime
    from ...._errors import MissingExtra

    raise MissingExtra("protobuf", "gateway") from exc
