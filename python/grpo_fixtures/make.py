"""A fixture from a real checkpoint: prompts -> `qwen2.sample` rollout -> rewards -> fixture.

Rows come in groups of G consecutive rows sharing one prompt (GRPO's group
of samples per prompt). Two ways to prompt:

- `make_fixture`: prompts all of one length P, read from a JSON file of
  token ids or drawn from the seed as ids below the lowest special id the
  config names (for Qwen2.5 that is 151643: ordinary text ids only); the
  rewards are a stand-in (uniform draws).
- `make_rollout`: a GRPO rollout as training makes it: tasks written in the
  repository (fixtures/tasks/), each asked through the model's chat
  template, G completions per task, every completion judged by the task's
  verifier (`verifier`), advantages from those rewards. Prompts of
  different lengths are left-padded (`qwen2.left_padded`).

The LM head is not copied into the fixture: the manifest names where it
comes from (a checkpoint directory relative to the fixture, or a model of
the package registry, `gguf_model`) and its sha256.
"""

import hashlib
import json
import os
import re
import sys
import time as clock

import numpy as np

from grpo_fixtures import fixture, gguf_model, qwen2, verifier

STREAM_PROMPTS, STREAM_REWARDS = 10, 11


def _rng(seed, stream):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, stream])))


def _read_json(path, unreadable, malformed):
    """(the raw bytes, the parsed JSON) of a file; ValueError starting with the given words."""
    try:
        with open(path, "rb") as stream:
            raw = stream.read()
        return raw, json.loads(raw)
    except OSError as error:
        raise ValueError(f"{unreadable}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{malformed}: {error}") from None


def read_prompts(path, batch, group):
    """Prompt ids [B, P] from a JSON file: [[id, ...], ...] or {"prompts": [[...], ...]}.

    B/G prompts (one per group, repeated G times) or B prompts (one per row),
    all of the same length.
    """
    raw, prompts = _read_json(path, f"{path}: cannot read the prompts file", f"{path}: not JSON")
    if isinstance(prompts, dict):
        prompts = prompts.get("prompts")
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, list) and p for p in prompts)):
        raise ValueError(f'{path}: expected a non-empty list of non-empty token-id lists (or {{"prompts": ...}})')
    if any(not isinstance(i, int) for p in prompts for i in p):
        raise ValueError(f"{path}: token ids must be integers")
    lengths = sorted({len(p) for p in prompts})
    if len(lengths) != 1:
        raise ValueError(f"{path}: prompts have lengths {lengths}; all must have one length (pad or trim them)")
    if len(prompts) == batch // group:
        prompts = [p for p in prompts for _ in range(group)]
    elif len(prompts) != batch:
        raise ValueError(
            f"{path}: {len(prompts)} prompts; expected {batch // group} (one per group) or {batch} (one per row)"
        )
    return np.asarray(prompts, np.int32), f"file {path} (sha256 {hashlib.sha256(raw).hexdigest()})"


def random_prompts(config, batch, group, prompt_len, seed):
    """Prompt ids [B, P], one random prompt per group, ids below the lowest special id."""
    limit = min(config.special_token_ids, default=config.vocab_size)
    limit = limit if 0 < limit <= config.vocab_size else config.vocab_size
    per_group = _rng(seed, STREAM_PROMPTS).integers(0, limit, size=(batch // group, prompt_len), dtype=np.int32)
    return np.repeat(per_group, group, axis=0), f"random ids in [0, {limit}) from seed {seed}, one per group"


def parse_eos(eos, config):
    """End-of-sequence ids: "config" (config.json's eos_token_id), "none", or "ID,ID,..."."""
    if eos == "config":
        return tuple(config.eos_token_ids)
    if eos == "none":
        return ()
    try:
        ids = tuple(int(part) for part in eos.split(","))
    except ValueError:
        raise ValueError(f"--eos {eos!r}: expected 'config', 'none' or comma-separated token ids") from None
    for token in ids:
        if not 0 <= token < config.vocab_size:
            raise ValueError(f"--eos id {token} is outside the vocabulary [0, {config.vocab_size})")
    return ids


def infer_revision(model_dir):
    """The commit of a Hugging Face cache snapshot path (.../snapshots/<40 hex>), else None."""
    match = re.search(r"snapshots[/\\]([0-9a-f]{40})", os.path.abspath(model_dir))
    return match.group(1) if match else None


def make_fixture(
    model_dir, out_dir, *, batch, time, temperature, seed, prompt_len=16, group=None,
    prompts_file=None, eos="config", model_name=None, revision=None, dtype="float32", command=None,
):
    """Sample a rollout from the checkpoint at model_dir and write it as a fixture; returns the manifest."""
    group = group or batch
    if batch < 1 or time < 1 or batch % group:
        raise ValueError(
            f"--batch {batch}, --time {time}, --group {group}: need batch, time >= 1 and group dividing batch"
        )
    if not temperature > 0:
        raise ValueError(f"--temperature {temperature}: must be > 0")
    config = qwen2.load_config(model_dir)
    if prompts_file:
        prompts, prompt_source = read_prompts(prompts_file, batch, group)
    else:
        if prompt_len < 1:
            raise ValueError(f"--prompt-len {prompt_len}: must be >= 1")
        prompts, prompt_source = random_prompts(config, batch, group, prompt_len, seed)
    if prompts.min() < 0 or prompts.max() >= config.vocab_size:
        raise ValueError(
            f"prompt token ids span [{prompts.min()}, {prompts.max()}]; expected [0, {config.vocab_size})"
        )
    eos_ids = parse_eos(eos, config)
    model, samples, seconds = _rollout(model_dir, dtype, prompts, time, temperature, eos_ids, seed)

    rewards = _rng(seed, STREAM_REWARDS).random(batch)
    arrays = _arrays(samples, rewards, group, prompts)
    with open(os.path.join(model_dir, "config.json")) as stream:
        architectures = json.load(stream).get("architectures") or [None]
    head = model.lm_head_source
    os.makedirs(out_dir, exist_ok=True)
    manifest = {
        "format": fixture.FORMAT,
        "format_version": fixture.FORMAT_VERSION,
        "synthetic": False,
        "model": {
            "name": model_name or os.path.basename(os.path.normpath(model_dir)),
            "revision": revision or infer_revision(model_dir),
            "architecture": architectures[0],
        },
        "shapes": {
            "B": batch, "T": time, "H": config.hidden_size, "V": config.vocab_size, "P": int(prompts.shape[1]),
        },
        "arrays": None,  # filled in by fixture.write
        "lm_head": _lm_head_section(config, head, {
            "kind": "checkpoint",
            "checkpoint_dir": os.path.relpath(os.path.abspath(model_dir), os.path.abspath(out_dir)),
            "tensor": head.tensor,
            "transpose": True,
        }),
        "sampling": {
            "temperature": temperature,
            "temperature_mode": "logits",
            "logits": "hidden (bf16) @ lm_head, exact products summed in f32",
            "old_logp": "log softmax(z / tau)[token] of those logits, in f32; 0 at padding",
            "eos_token_ids": list(eos_ids),
            "prompt_lengths": [int(prompts.shape[1])] * batch,
            "prompt_source": prompt_source,
            "completion_lengths": [int(n) for n in samples.mask.sum(axis=1)],
            "group_size": group,
            "compute_dtype": dtype,
            "padding": {"tokens": fixture.PAD_TOKEN, "mask": 0, "old_logp": 0, "hidden": 0},
        },
        "rewards": {"method": fixture.REWARDS_METHOD, "rewards": [round(float(r), 6) for r in rewards]},
        "generated_by": _generated_by(command, seed, "grpo_fixtures.make", seconds),
        "statistics": fixture.sampling_statistics(samples.max_prob, samples.rank, samples.old_logp, samples.mask),
    }
    return _write(out_dir, manifest, arrays, model_dir, samples, seconds)


def _arrays(samples, rewards, group, prompts):
    """The fixture's arrays of a rollout and its rewards."""
    return {
        "hidden": samples.hidden,
        "tokens": samples.tokens,
        "mask": samples.mask,
        "old_logp": samples.old_logp,
        "advantages": fixture.group_advantages(rewards, group),
        "prompts": prompts,
    }


def _rollout(model_dir, dtype, prompts, time, temperature, eos_ids, seed, pad=None):
    """(the model, its samples, the seconds its loading and sampling took)."""
    started = clock.perf_counter()
    model = qwen2.load_model(model_dir, dtype)
    loaded = clock.perf_counter()
    samples = qwen2.sample(model, prompts, time, temperature, eos_ids, seed, pad=pad)
    return model, samples, {"load": round(loaded - started, 1), "sample": round(clock.perf_counter() - loaded, 1)}


def _lm_head_section(config, head, source):
    """The manifest's lm_head: the [H, V] head of the checkpoint, its sha256, where it comes from."""
    return {
        "layout": fixture.LM_HEAD_LAYOUT,
        "dtype": head.dtype,
        "shape": [config.hidden_size, config.vocab_size],
        "sha256": head.sha256,
        "source": source,
    }


def _generated_by(command, seed, tool, seconds):
    return {"command": command, "seed": seed, "tool": tool, "versions": fixture.versions(with_jax=True), "seconds": seconds}


def _write(out_dir, manifest, arrays, model_dir, samples, seconds, note=""):
    """Writes the fixture (checked as it is read back) and says on stderr what the rollout took."""
    manifest, _ = fixture.write(out_dir, manifest, arrays)
    print(
        f"loaded {model_dir} in {seconds['load']:.1f} s; sampled {samples.tokens.shape[0]} x {samples.steps} steps "
        f"in {seconds['sample']:.1f} s (compile included){note}",
        file=sys.stderr,
    )
    return manifest


def read_tasks(path, task_ids):
    """(the tasks file's JSON, its sha256, the selected tasks in order) of a tasks file (fixtures/tasks/)."""
    raw, document = _read_json(path, f"--tasks {path}: cannot read", f"--tasks {path}: not JSON")
    tasks = document.get("tasks") if isinstance(document, dict) else None
    if not isinstance(tasks, list) or not tasks:
        raise ValueError(f'--tasks {path}: expected {{"tasks": [{{"id", "prompt", "verifier", ...}}, ...]}}')
    by_id = {}
    for task in tasks:
        if not isinstance(task, dict) or not isinstance(task.get("id"), str) or not isinstance(task.get("prompt"), str):
            raise ValueError(f"--tasks {path}: every task needs an 'id' and a 'prompt' string: {task!r}")
        if task.get("verifier") not in verifier.VERIFIERS:
            raise ValueError(f"--tasks {path}: task {task['id']!r}: verifier must be one of {verifier.VERIFIERS}")
        if task["verifier"] == "boxed-number" and verifier.as_number(str(task.get("answer"))) is None:
            raise ValueError(f"--tasks {path}: task {task['id']!r}: answer {task.get('answer')!r} is not a number")
        if task["verifier"] == "python-tests" and not isinstance(task.get("tests"), str):
            raise ValueError(f"--tasks {path}: task {task['id']!r}: python-tests needs a 'tests' string")
        by_id[task["id"]] = task
    selected = []
    for task_id in task_ids or list(by_id):
        if task_id not in by_id:
            raise ValueError(f"--task-ids {task_id}: no such task in {path}; its tasks are {', '.join(by_id)}")
        selected.append(by_id[task_id])
    return document, hashlib.sha256(raw).hexdigest(), selected


def chat_prompts(model_dir, document, tasks):
    """(the tokenizer, the chat-formatted text and token ids of each task): the model's own template."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as error:
        raise ValueError(f"--model-dir {model_dir}: no usable tokenizer there ({error})") from None
    if not tokenizer.chat_template:
        raise ValueError(f"--model-dir {model_dir}: the tokenizer has no chat template")
    instruction = document.get("instruction")
    texts, ids = [], []
    for task in tasks:
        content = task["prompt"] if not instruction else f"{task['prompt']}\n\n{instruction}"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        texts.append(text)
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return tokenizer, texts, ids


def make_rollout(
    model_dir, out_dir, *, tasks_file, task_ids=None, group, time, temperature, seed, eos="config",
    dtype="float32", command=None,
):
    """A GRPO rollout on tasks: G completions per task, judged by its verifier; writes the fixture, returns the manifest."""
    if group < 1 or time < 1:
        raise ValueError(f"--group {group}, --time {time}: need group, time >= 1")
    if not temperature > 0:
        raise ValueError(f"--temperature {temperature}: must be > 0")
    config = qwen2.load_config(model_dir)
    document, tasks_sha256, tasks = read_tasks(tasks_file, task_ids)
    tokenizer, texts, prompt_ids = chat_prompts(model_dir, document, tasks)
    rows = [task for task in tasks for _ in range(group)]
    prompts, pad = qwen2.left_padded([ids for ids in prompt_ids for _ in range(group)])
    eos_ids = parse_eos(eos, config)
    model, samples, seconds = _rollout(model_dir, dtype, prompts, time, temperature, eos_ids, seed, pad=pad)

    rollouts, rewards = [], []
    for row, task in enumerate(rows):
        valid = samples.tokens[row][samples.mask[row] > 0]
        ended = bool(valid.size) and int(valid[-1]) in eos_ids
        text = tokenizer.decode(valid[:-1] if ended else valid, skip_special_tokens=False)
        reward, detail = verifier.judge(task, text)
        rewards.append(reward)
        rollouts.append({
            "row": row, "task": task["id"], "reward": reward, "verdict": detail,
            "tokens": int(valid.size), "ended": "end-of-sequence token" if ended else f"cut at T = {time}",
            "completion": text,
        })
    rewards = np.asarray(rewards, np.float64)
    arrays = _arrays(samples, rewards, group, prompts)
    registry = gguf_model.conversion_record(model_dir)
    head = model.lm_head_source
    if registry:
        model_section = {
            "name": registry["model"]["name"], "revision": None, "architecture": "Qwen2ForCausalLM",
            "registry": registry["model"], "conversion": registry["method"],
        }
        source = {"kind": "registry", "model": registry["model"]["key"], "tensor": head.tensor, "transpose": True}
    else:
        model_section = {
            "name": os.path.basename(os.path.normpath(model_dir)), "revision": infer_revision(model_dir),
            "architecture": "Qwen2ForCausalLM",
        }
        source = {
            "kind": "checkpoint", "tensor": head.tensor, "transpose": True,
            "checkpoint_dir": os.path.relpath(os.path.abspath(model_dir), os.path.abspath(out_dir)),
        }
    lengths = [int(prompts.shape[1] - n) for n in pad]
    manifest = {
        "format": fixture.FORMAT,
        "format_version": fixture.FORMAT_VERSION,
        "synthetic": False,
        "model": model_section,
        "shapes": {
            "B": len(rows), "T": time, "H": config.hidden_size, "V": config.vocab_size, "P": int(prompts.shape[1]),
        },
        "arrays": None,  # filled in by fixture.write
        "lm_head": _lm_head_section(config, head, source),
        "sampling": {
            "temperature": temperature,
            "temperature_mode": "logits",
            "top_k": None, "top_p": None,
            "max_new_tokens": time,
            "logits": "hidden (bf16) @ lm_head (bf16), exact products summed in f32",
            "old_logp": "log softmax(z / tau)[token] of those logits, in f32; 0 at padding",
            "eos_token_ids": list(eos_ids),
            "prompt_lengths": lengths,
            "prompt_padding": fixture.PROMPT_PADDING,
            "positions": fixture.POSITIONS,
            "prompt_source": f"tasks {tasks_file} (sha256 {tasks_sha256}) through the model's chat template",
            "completion_lengths": [int(n) for n in samples.mask.sum(axis=1)],
            "group_size": group,
            "compute_dtype": dtype,
            "padding": {"tokens": fixture.PAD_TOKEN, "mask": 0, "old_logp": 0, "hidden": 0, "prompts": fixture.PAD_TOKEN},
        },
        "prompts": {
            "tasks_file": tasks_file,
            "tasks_sha256": tasks_sha256,
            "instruction": document.get("instruction"),
            "chat_template": "the tokenizer's own (tokenizer.apply_chat_template, add_generation_prompt=True, "
                             "one user message: the task's prompt, a blank line, the instruction)",
            "tasks": [{key: task[key] for key in ("id", "prompt", "verifier", "answer", "tests") if key in task}
                      for task in tasks],
            "chat_texts": texts,
            "row_tasks": [task["id"] for task in rows],
        },
        "rewards": {
            "method": f"verifier per task (python/grpo_fixtures/verifier.py): "
                      f"{sorted({task['verifier'] for task in tasks})}; {fixture.ADVANTAGES_METHOD}",
            "rewards": [float(r) for r in rewards],
        },
        "rollouts": rollouts,
        "generated_by": _generated_by(command, seed, "grpo_fixtures.make (tasks)", seconds),
        "statistics": fixture.sampling_statistics(samples.max_prob, samples.rank, samples.old_logp, samples.mask),
    }
    return _write(out_dir, manifest, arrays, model_dir, samples, seconds, f"; rewards {rewards.tolist()}")
