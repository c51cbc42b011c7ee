"""Log bench figures to Weights & Biases, and read an offline run back.

    python -m grpo_bench.wandb_log log --project P --mode online|offline|disabled [--dir D]
        stdin: one JSON object per run:
            {"name": str, "group": str, "job_type": str, "config": {...}, "metrics": {...}}
        stdout: one JSON object per logged run: {"name": str, "run_dir": str | null}
    python -m grpo_bench.wandb_log read RUN_DIR_OR_FILE
        stdout: the run's records as JSON lines ({"run": {...}}, {"config": {...}},
        {"history": {...}}, {"summary": {...}}); how the suite checks offline logging.

The metrics are logged as one history step, which W&B also keeps as the run
summary (the seed team's `avg_step_ms`, `first_call_s` and memory are keys).
"""

import argparse
import glob
import json
import os
import struct
import sys

# The offline run file: a 7-byte W&B header (":W&B", magic 0xBEE1, version),
# then LevelDB log records in 32 KiB blocks: crc32c (4), length (2 LE), type (1),
# data; types FULL 1, FIRST 2, MIDDLE 3, LAST 4; a block's last < 7 bytes are padding.
_HEADER = 7
_BLOCK = 32768
_RECORD_HEADER = 7


def _records(path):
    """The raw protobuf records of a .wandb file, in order."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _HEADER or data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file (no :W&B header)")
    position, pending = _HEADER, b""
    while position + _RECORD_HEADER <= len(data):
        left_in_block = _BLOCK - position % _BLOCK
        if left_in_block < _RECORD_HEADER:
            position += left_in_block
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        body = data[position + _RECORD_HEADER: position + _RECORD_HEADER + length]
        position += _RECORD_HEADER + length
        if kind == 0 and length == 0:
            continue
        if kind == 1:
            yield body
        elif kind == 2:
            pending = body
        elif kind == 3:
            pending += body
        elif kind == 4:
            yield pending + body
            pending = b""


def read_run(path):
    """[(record type, dict)] of an offline run: run, config, history and summary records."""
    from wandb.proto import wandb_internal_pb2

    if os.path.isdir(path):
        files = glob.glob(os.path.join(path, "*.wandb"))
        if len(files) != 1:
            raise ValueError(f"{path} holds {len(files)} .wandb files; expected 1")
        path = files[0]
    out = []
    for raw in _records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.append(("run", {"project": record.run.project, "name": record.run.display_name,
                                "group": record.run.run_group, "job_type": record.run.job_type}))
            config = {i.key: json.loads(i.value_json) for i in record.run.config.update if i.key}
            if config:
                out.append(("config", config))
        elif kind == "config":
            out.append(("config", {i.key: json.loads(i.value_json) for i in record.config.update if i.key}))
        elif kind == "history":
            out.append(("history", {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                    for i in record.history.item}))
        elif kind == "summary":
            out.append(("summary", {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                    for i in record.summary.update}))
    return out


def log(args):
    import wandb

    for line in sys.stdin:
        if not line.strip():
            continue
        run_spec = json.loads(line)
        run = wandb.init(
            project=args.project,
            mode=args.mode,
            dir=args.dir,
            name=run_spec["name"],
            group=run_spec.get("group"),
            job_type=run_spec.get("job_type"),
            config=run_spec.get("config", {}),
            reinit="finish_previous",
        )
        run.log(run_spec.get("metrics", {}))  # one history step; W&B copies it to the summary
        run_dir = None if args.mode == "disabled" else os.path.dirname(run.dir)
        run.finish()
        print(json.dumps({"name": run_spec["name"], "run_dir": run_dir}), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m grpo_bench.wandb_log")
    commands = parser.add_subparsers(dest="command", required=True)
    log_parser = commands.add_parser("log")
    log_parser.add_argument("--project", required=True)
    log_parser.add_argument("--mode", choices=("online", "offline", "disabled"), required=True)
    log_parser.add_argument("--dir", default=None)
    read_parser = commands.add_parser("read")
    read_parser.add_argument("path")
    args = parser.parse_args(argv)
    if args.command == "log":
        os.environ.setdefault("WANDB_SILENT", "true")
        log(args)
    else:
        for kind, value in read_run(args.path):
            print(json.dumps({kind: value}))


if __name__ == "__main__":
    main()
