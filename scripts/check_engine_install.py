"""Does this project install beside a serving engine? pip resolves both together, nothing installed.

Runs `pip install --dry-run --ignore-installed --report FILE ENGINE==VERSION PROJECT[EXTRA]` (the project from this
checkout) and prints the versions pip would install of the packages both sides constrain (protobuf, ortools,
transformers, torch, numpy), or pip's own reason when the two cannot be installed together. It needs the package
index pip is configured with; it installs nothing.

Usage: python scripts/check_engine_install.py [--engine vllm|sglang] [--version V] [--json]
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from eplb.cli.flags import OneLineParser

ROOT = Path(__file__).resolve().parent.parent
# name, version, the project's extras installed beside it (as scripts/engine_env.sh installs them, less test tools)
ENGINES = {"vllm": ("vllm", "0.33.0", "vllm,hf"), "sglang": ("sglang", "0.5.23", "sglang,hf")}
SHARED = ("protobuf", "ortools", "transformers", "torch", "numpy", "pydantic")
TIMEOUT_S = 1800


def resolve(engine: str, version: str, extra: str | None) -> dict:
    """{"ok", "versions" (package -> version pip would install), "error" (pip's last lines when it failed)}."""
    project = f"{ROOT}[{extra}]" if extra else str(ROOT)
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                   "--report", str(report), f"{engine}=={version}", project]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"ok": False, "versions": {}, "error": f"pip did not finish in {TIMEOUT_S} s"}
        if done.returncode != 0 or not report.is_file():
            lines = [line for line in done.stderr.splitlines() if line.strip() and "is ignored" not in line]
            return {"ok": False, "versions": {}, "error": " | ".join(lines[-6:]) or f"pip exited {done.returncode}"}
        installed = json.loads(report.read_text()).get("install", [])
    versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in installed}
    return {"ok": True, "versions": {name: versions.get(name) for name in (engine, "eplb") + SHARED}, "error": None}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm", help="the engine to resolve beside")
    parser.add_argument("--version", default=None, help="the engine's version (default: the one checked in docs: "
                                                         + ", ".join(f"{k} {v[1]}" for k, v in ENGINES.items()) + ")")
    parser.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    args = parser.parse_args(argv)
    name, default_version, extra = ENGINES[args.engine]
    version = args.version or default_version
    if not version.replace(".", "").replace("rc", "").replace("post", "").isalnum():
        parser.error(f"--version must be a release like {default_version}; got {version!r}")
    result = {"engine": name, "version": version, "extra": extra, **resolve(name, version, extra)}
    if args.json:
        print(json.dumps(result, sort_keys=True))
    elif result["ok"]:
        print(f"{name}=={version} and eplb{f'[{extra}]' if extra else ''} resolve together: "
              + ", ".join(f"{package} {v}" for package, v in result["versions"].items() if v))
    else:
        print(f"check_engine_install: {name}=={version} and this project do not resolve together: "
              f"{result['error']}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
