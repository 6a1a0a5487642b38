"""The pytest plugin: fixtures start a per-test mock from a dict or a file."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_marker_and_factory_fixtures(pytester: pytest.Pytester) -> None:
    """A test file using both fixtures passes, each test on its own fresh server."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makefile(
        ".yaml",
        scenario="routes:\n  - match: {path: /x}\n    sequence: [{status: 503}, {status: 200}]\n",
    )
    pytester.makepyfile(
        """
        import httpx
        import pytest

        SCENARIO = {"routes": [{"match": {"path": "/x"}, "sequence": [{"status": 503}, {}]}]}

        @pytest.mark.stormguard_scenario(SCENARIO)
        def test_marker_one(stormguard_server):
            assert httpx.get(stormguard_server.url + "/x").status_code == 503

        @pytest.mark.stormguard_scenario(SCENARIO)
        def test_marker_two_starts_afresh(stormguard_server):
            assert httpx.get(stormguard_server.url + "/x").status_code == 503

        def test_factory_with_a_file(stormguard_mock):
            mock = stormguard_mock("scenario.yaml")
            codes = [httpx.get(mock.url + "/x").status_code for _ in range(2)]
            assert codes == [503, 200]
            assert len(mock.journal()) == 2
            assert mock.ledger() == {}
            assert mock.check().ok

        def test_server_without_marker_is_a_usage_error(stormguard_server):
            pass
        """
    )
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*stormguard_server needs @pytest.mark.stormguard_scenario*"])
