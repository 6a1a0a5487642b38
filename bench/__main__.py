"""Run the benchmarks: ``python -m bench`` runs all, ``python -m bench retry limiters``.

Each benchmark module has ``main(quick: bool) -> None`` and prints its figures as
ratios against the peer libraries measured in the same run.
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = {
    "retry": "bench.bench_retry",
    "headers": "bench.bench_headers",
    "breaker": "bench.bench_breaker",
    "limiters": "bench.bench_limiters",
    "sim": "bench.bench_sim",
    "fuzz_headers": "bench.fuzz_headers",
    "fuzz_scenarios": "bench.fuzz_scenarios",
    "server": "bench.bench_server",
    "gateway": "bench.bench_gateway",
    "gateway-counts": "bench.bench_gateway_counts",
    "gateway-instructions": "bench.bench_gateway_instructions",
    "gateway-grpc": "bench.bench_gateway_grpc",
    "http": "bench.bench_http",
    "http-counts": "bench.bench_http_counts",
    "rls": "bench.bench_rls",
    "rls-instructions": "bench.bench_rls_instructions",
    "store-scale": "bench.bench_store_scale",
    "overload": "bench.bench_overload",
    "overload-gateway": "bench.bench_overload_gateway",
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", choices=[*BENCHMARKS, []], help="benchmarks to run")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    args = parser.parse_args()
    for name in args.names or list(BENCHMARKS):
        try:
            module = importlib.import_module(BENCHMARKS[name])
        except ModuleNotFoundError as exc:
            if exc.name == BENCHMARKS[name]:
                print(f"[{name}] not written yet, skipped")
                continue
            raise
        print(f"\n=== {name} ===")
        module.main(quick=args.quick)


if __name__ == "__main__":
    main()
