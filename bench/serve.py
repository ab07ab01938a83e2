"""Serving benchmark for any OpenAI-compatible server (`/v1/completions`, streamed).

    python bench/serve.py run --base-url http://127.0.0.1:8000 --vocab-size 8192 \\
        --max-concurrency 64 -o folio.json --label folio
    python bench/serve.py run --base-url http://127.0.0.1:8000 --model-dir DIR \\
        --request-rate 4 -o folio-rate4.json
    python bench/serve.py plot folio.json vllm.json -o serve.png   # latency vs load
    python bench/serve.py race --help       # folio serve vs vllm serve, alternated
    python bench/serve.py variants --help   # folio serve under flag sets, alternated
    python bench/serve.py peers --help      # folio serve vs llama.cpp and vLLM, alternated

`run` is the client alone (bench/serve_client.py: the workload and the report), `plot`
draws reports (bench/serve_plot.py), `race` starts the servers itself
(bench/serve_race.py), `variants` races `folio serve` configurations against each other
(bench/serve_variants.py: CPU placement, data-parallel replicas, any flag or variable),
`peers` races `folio serve` against llama.cpp's llama-server and vLLM under `vllm bench
serve` (bench/serve_peers.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import serve_client  # noqa: E402

COMMANDS = {"race": "bench.serve_race", "variants": "bench.serve_variants",
            "peers": "bench.serve_peers"}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in COMMANDS:   # they parse their own flags
        import importlib

        importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_client.add_run_args(sub.add_parser("run", help="drive one server"))
    plot = sub.add_parser("plot", help="latency vs load, one line per server")
    plot.add_argument("files", nargs="+", type=Path)
    plot.add_argument("-o", "--out", type=Path, required=True)
    sub.add_parser("race", help="folio serve vs vllm serve, alternated (race --help)")
    sub.add_parser("variants", help="folio serve flag sets, alternated (variants --help)")
    sub.add_parser("peers", help="folio serve vs llama.cpp and vLLM (peers --help)")
    args = parser.parse_args(argv)
    if args.command == "plot":
        from bench.serve_plot import plot_files

        plot_files(args.files, args.out)
        print(f"chart: {args.out}")
        return
    serve_client.run(args)


if __name__ == "__main__":
    main()
