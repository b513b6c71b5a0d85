"""Preflight diagnostics: one named check per assumption, run in the order the data flows, and the report.

Each check isolates one assumption of the pipeline and either returns what it measured or raises CheckFailed
with the measurement, the threshold and the likely causes (the debugging guide's symptom -> cause map).
Checks whose prerequisites did not pass are reported as skipped, with the reason. The checks that train
(lr_stability, rehearsal_learns, single_batch_overfit) live in minigpt.rehearsal; the gate in minigpt.gate.
"""

from __future__ import annotations

import copy
import math
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from minigpt import batching, train_step
from minigpt.checks import Check, CheckFailed, CheckResult, Context, run_checks
from minigpt.config import Params
from minigpt.device import mps_available, select_device
from minigpt.encoding import load_ids, load_meta
from minigpt.errors import MinigptError
from minigpt.gate import current_fingerprints, gated_config
from minigpt.io_utils import atomic_write_json, canonical_json_digest, sha256_file
from minigpt.model import MiniGPTConfig
from minigpt.nonfinite import NonFiniteTracker
from minigpt.paths import DEBUG_REPORT, ENCODED_DIR, SPLITS, TOKENIZER_FILE, clean_split_path
from minigpt.rehearsal import (SUSTAIN, check_lr_stability, check_rehearsal_learns,
                               check_single_batch_overfit, rehearsal_warmup)
from minigpt.textstats import codepoints, from_codepoints
from minigpt.tokenizer import CharTokenizer

CAUSAL_ATOL = 1e-5
CAUSAL_GRAD_ATOL = 1e-10
SUMMARY_FIELDS = ("tokenizer_fingerprint", "vocab_size", "token_range", "batch_shape", "initial_loss",
                  "expected_initial_loss", "grad_norm", "missing_gradients", "frozen_parameters", "param_update_max",
                  "rehearsal_loss", "single_batch_final_loss")


# ------------------------------------------------------------------------------------------------ the checks

def check_environment(ctx: Context) -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "device": str(ctx.device),
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "mps_available": mps_available(),
        "threads": torch.get_num_threads(),
    }


def required_files(ctx: Context) -> list[Path]:
    return [
        *[ctx.path(clean_split_path(split)) for split in SPLITS],
        ctx.path(TOKENIZER_FILE),
        ctx.path(ENCODED_DIR / "meta.json"),
        *[ctx.path(ENCODED_DIR / f"{split}.npy") for split in SPLITS],
    ]


def check_files(ctx: Context) -> dict:
    sizes, problems = {}, []
    for path in required_files(ctx):
        key = str(path.relative_to(ctx.root)) if path.is_relative_to(ctx.root) else str(path)
        if not path.is_file():
            problems.append(f"{key} is missing")
        elif path.stat().st_size == 0:
            problems.append(f"{key} is empty")
        else:
            sizes[key] = path.stat().st_size
    if problems:
        raise CheckFailed("; ".join(problems), {"sizes": sizes})
    try:
        ctx.tokenizer = CharTokenizer.load(ctx.path(TOKENIZER_FILE))
        ctx.meta = load_meta(ctx.path(ENCODED_DIR))
    except MinigptError as exc:
        raise CheckFailed(str(exc), {"sizes": sizes}) from None
    changed = [
        split for split in SPLITS
        if sha256_file(ctx.path(ENCODED_DIR / f"{split}.npy")) != ctx.meta["splits"][split]["sha256"]
    ]
    if changed:
        raise CheckFailed(f"encoded arrays changed after encode (SHA-256 differs from meta.json): {', '.join(changed)}", {"sizes": sizes})
    return {"sizes": sizes}


def check_tokenizer(ctx: Context) -> dict:
    """Every stored ID of every split decodes to exactly its clean text, and re-encodes to the same IDs."""
    tok = ctx.tokenizer
    measured: dict[str, Any] = {"tokenizer_fingerprint": tok.fingerprint, "encoded_with": ctx.meta["tokenizer_fingerprint"],
                                "splits": {}}
    ctx.summary.update(tokenizer_fingerprint=tok.fingerprint, vocab_size=tok.vocab_size)
    problems = []
    for split in SPLITS:
        ids = np.asarray(load_ids(ctx.path(ENCODED_DIR), split))
        clean = codepoints(ctx.path(clean_split_path(split)).read_bytes().decode("utf-8"))
        try:
            decoded = tok.decode_codepoints(ids)  # vectorised decode of the whole split
        except MinigptError as exc:
            problems.append(f"{split}: {exc}")
            continue
        common = min(decoded.size, clean.size)
        diff = np.flatnonzero(decoded[:common] != clean[:common])
        mismatch = int(diff[0]) if diff.size else (common if decoded.size != clean.size else None)
        round_trip = bool(np.array_equal(tok.encode(from_codepoints(decoded)), ids))
        measured["splits"][split] = {"chars_checked": int(ids.size), "clean_chars": int(clean.size),
                                     "matches_clean_text": mismatch is None, "first_mismatch": mismatch,
                                     "round_trip_equal": round_trip}
        if not round_trip:
            problems.append(f"{split}: encode(decode(ids)) != ids")
        if mismatch is not None:
            got = from_codepoints(decoded[mismatch:mismatch + 20])
            want = from_codepoints(clean[mismatch:mismatch + 20])
            problems.append(f"decoded {split} IDs differ from {clean_split_path(split)} at character {mismatch} "
                            f"(lengths {decoded.size} vs {clean.size}): {got!r} vs {want!r}")
    if ctx.meta["tokenizer_fingerprint"] != tok.fingerprint:
        problems.append("data/encoded was encoded with a different tokenizer than data/tokenizer/char_tokenizer.json "
                        "(fingerprints differ)")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    return measured


def check_token_ids(ctx: Context) -> dict:
    vocab = ctx.tokenizer.vocab_size
    window = ctx.model_config.block_size + 1
    ranges, bad = {}, []
    for split in SPLITS:
        ids = load_ids(ctx.path(ENCODED_DIR), split)
        if ids.size == 0:
            ranges[split] = {"dtype": str(ids.dtype), "length": 0}
            bad.append(f"{split}: the split is empty")
            continue
        lo, hi = int(ids.min()), int(ids.max())
        ranges[split] = {"dtype": str(ids.dtype), "min": lo, "max": hi, "length": int(ids.size)}
        if ids.dtype.kind not in "ui":
            bad.append(f"{split}: dtype {ids.dtype} is not an integer type")
        elif lo < 0 or hi >= vocab:
            bad.append(f"{split}: IDs span [{lo}, {hi}] but must lie in [0, {vocab - 1}]")
        if ids.size < window:
            bad.append(f"{split}: {ids.size} tokens, fewer than one window of model.block_size + 1 = {window} "
                       "(use more text or a smaller model.block_size)")
    ctx.summary["token_range"] = ranges
    measured = {"vocab_size": vocab, "min_split_length": window, "splits": ranges}
    if bad:
        raise CheckFailed("; ".join(bad), measured)
    ctx.splits = {split: torch.from_numpy(np.asarray(load_ids(ctx.path(ENCODED_DIR), split), dtype=np.int64)) for split in SPLITS}
    return measured


def check_batch_shift(ctx: Context) -> dict:
    cfg = ctx.model_config
    batch_size = ctx.params.preflight.batch_size
    inputs, targets = batching.get_batch(ctx.splits["train"], batch_size, cfg.block_size, ctx.device, ctx.generator(1))
    measured = {
        "inputs_shape": list(inputs.shape),
        "targets_shape": list(targets.shape),
        "dtypes": [str(inputs.dtype), str(targets.dtype)],
        "device": str(inputs.device),
    }
    problems = []
    if inputs.shape != targets.shape or list(inputs.shape) != [batch_size, cfg.block_size]:
        problems.append(f"shapes {list(inputs.shape)} / {list(targets.shape)}, expected [{batch_size}, {cfg.block_size}] both")
    if inputs.dtype != torch.long or targets.dtype != torch.long:
        problems.append(f"dtypes {inputs.dtype} / {targets.dtype}, expected torch.int64")
    if inputs.device.type != ctx.device.type or targets.device.type != ctx.device.type:
        problems.append(f"batch on {inputs.device}, model on {ctx.device}")
    if not problems:
        shifted = bool(torch.equal(inputs[:, 1:], targets[:, :-1]))
        identical = float((inputs == targets).float().mean())
        measured.update(shift_ok=shifted, identical_fraction=round(identical, 4))
        if not shifted:
            problems.append("inputs[:, 1:] != targets[:, :-1]: targets are not the inputs shifted by one")
        elif identical == 1.0:
            problems.append("targets equal inputs")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    ctx.batch = (inputs, targets)
    ctx.summary["batch_shape"] = list(inputs.shape)
    return measured


def check_forward_shapes(ctx: Context) -> dict:
    ctx.seed_all(2)
    model = ctx.model_factory(ctx.model_config).to(ctx.device)
    ctx.model = model
    inputs, targets = ctx.batch
    model.eval()
    with torch.no_grad(), NonFiniteTracker(model) as tracker:
        logits, loss = model(inputs, targets)
    expected = [inputs.shape[0], inputs.shape[1], ctx.model_config.vocab_size]
    measured = {"logits_shape": list(logits.shape), "expected_shape": expected, "loss_shape": list(loss.shape),
                "loss": float(loss), "parameters": sum(p.numel() for p in model.parameters())}
    if list(logits.shape) != expected:
        raise CheckFailed(f"logits shape {list(logits.shape)}, expected {expected}", measured)
    if loss.dim() != 0:
        raise CheckFailed(f"loss is not a scalar (shape {list(loss.shape)})", measured)
    if not torch.isfinite(loss):
        measured["first_nonfinite_module"] = tracker.first
        raise CheckFailed(f"loss is {float(loss)}; first non-finite output in module '{tracker.first}'", measured)
    return measured


def check_initial_loss(ctx: Context) -> dict:
    model = ctx.model
    model.eval()
    with torch.no_grad():
        _, loss = model(*ctx.batch)
    expected = math.log(ctx.model_config.vocab_size)
    tol = ctx.params.preflight.initial_loss_tolerance
    loss = float(loss)
    ctx.summary.update(initial_loss=loss, expected_initial_loss=expected)
    measured = {"initial_loss": round(loss, 5), "expected_log_v": round(expected, 5), "difference": round(loss - expected, 5)}
    if loss > expected + tol:
        raise CheckFailed(
            f"initial loss {loss:.4f} is far ABOVE log(V) = {expected:.4f}: the model starts confidently wrong "
            "(extreme initial logits / too-large init, targets that do not match the inputs, or a loss on wrong IDs)",
            measured,
        )
    if loss < expected - tol:
        raise CheckFailed(
            f"initial loss {loss:.4f} is far BELOW log(V) = {expected:.4f}: an untrained model cannot do better than "
            "chance, so it sees the answer (future tokens visible through the mask, unshifted targets with a copy "
            "path, or weights loaded instead of a fresh init)",
            measured,
        )
    return measured


def check_causal_independence(ctx: Context) -> dict:
    model = ctx.model
    model.eval()
    inputs = ctx.batch[0][:2]
    time_steps = inputs.shape[1]
    if time_steps < 2:
        return {"skipped_reason": "block_size 1 has no future"}
    cut = time_steps // 2
    changed = inputs.clone()
    # a different suffix: rotate every future ID (guaranteed to differ when V > 1)
    changed[:, cut:] = (changed[:, cut:] + 1) % ctx.model_config.vocab_size
    with torch.no_grad():
        a, _ = model(inputs)
        b, _ = model(changed)
    prefix_diff = float((a[:, :cut] - b[:, :cut]).abs().max())
    suffix_diff = float((a[:, cut:] - b[:, cut:]).abs().max())

    # gradient proof: d(logits at t) / d(input embedding at t' > t) must be exactly zero
    captured = {}

    def keep_grad(_module, _inputs, output):
        # replace the embedding output by a leaf, so its gradient exists even if parameters are frozen
        leaf = output.detach().requires_grad_(True)
        captured["emb"] = leaf
        return leaf

    embedding = _token_embedding(model)
    handle = embedding.register_forward_hook(keep_grad)
    try:
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            logits, _ = model(inputs)
            t = cut - 1
            logits[:, t].float().pow(2).sum().backward()
    finally:
        handle.remove()
    grad = captured["emb"].grad
    if grad is None:
        raise CheckFailed(
            f"no gradient reaches the token embedding's output ('{_module_name(model, embedding)}') from the logits: "
            "the residual stream is cut from the embeddings (a .detach(), a no_grad block or a re-created tensor "
            "between them), so the model cannot learn from its inputs",
            {"position": t, "embedding_output_grad": None},
        )
    future_grad = float(grad[:, t + 1:].abs().max())
    past_grad = float(grad[:, : t + 1].abs().max())
    model.zero_grad(set_to_none=True)
    measured = {
        "prefix_max_abs_diff": prefix_diff,
        "suffix_max_abs_diff": suffix_diff,
        "position": t,
        "future_grad_max": future_grad,
        "past_grad_max": past_grad,
    }
    if prefix_diff > CAUSAL_ATOL or future_grad > CAUSAL_GRAD_ATOL:
        raise CheckFailed(
            f"logits before position {cut} depend on later tokens (prefix diff {prefix_diff:.2e}, "
            f"d logits[{t}] / d embedding[>{t}] = {future_grad:.2e}): the causal mask is missing or wrong",
            measured,
        )
    if past_grad == 0.0:
        raise CheckFailed("no gradient reaches even the past embeddings: the check is not measuring anything", measured)
    return measured


def _module_name(model: nn.Module, module: nn.Module) -> str:
    return next((name for name, m in model.named_modules() if m is module), type(module).__name__)


def _token_embedding(model: nn.Module) -> nn.Module:
    if hasattr(model, "tok_emb"):
        return model.tok_emb
    return next(m for m in model.modules() if isinstance(m, nn.Embedding))


def check_gradients(ctx: Context) -> dict:
    """One backward pass of the run's loss (its precision, through the shared step's forward): every parameter
    trains (the configuration freezes none) and gets a finite, non-zero gradient."""
    model = ctx.model
    model.train()
    model.zero_grad(set_to_none=True)
    named = list(model.named_parameters())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    frozen = [n for n, p in named if not p.requires_grad]
    measured: dict[str, Any] = {"trainable": len(trainable), "frozen": len(frozen), "frozen_names": frozen[:50],
                                "precision": ctx.params.train.precision}
    ctx.summary["frozen_parameters"] = frozen
    if not trainable:
        ctx.summary.update(grad_norm=0.0, missing_gradients=[n for n, _ in named])
        raise CheckFailed("no parameter requires grad: every parameter is frozen", measured)
    ctx.seed_all(3)
    with NonFiniteTracker(model) as tracker:
        loss = train_step.calc_loss_batch(model, *ctx.batch, ctx.params.train.precision)
        loss.backward()
    missing = [n for n, p in trainable if p.grad is None]
    nonfinite = [n for n, p in trainable if p.grad is not None and not torch.isfinite(p.grad).all()]
    all_zero = [n for n, p in trainable if p.grad is not None and n not in nonfinite and not p.grad.any()]
    norms = {n: float(p.grad.norm()) for n, p in trainable if p.grad is not None}
    global_norm = math.sqrt(sum(v * v for v in norms.values()))
    measured.update(global_norm=global_norm, missing=missing, nonfinite=nonfinite, all_zero=all_zero,
                    per_parameter_norms=norms)
    if tracker.first:
        measured["first_nonfinite_module"] = tracker.first
    ctx.summary.update(grad_norm=global_norm, missing_gradients=missing)
    model.zero_grad(set_to_none=True)
    problems = []
    if frozen:
        # nothing in the configuration freezes a parameter, so a frozen one is a bug that training would hide
        problems.append(f"frozen parameters (requires_grad=False) that the run would never train: "
                        f"{', '.join(frozen[:12])}{' …' if len(frozen) > 12 else ''}")
    if missing:
        problems.append(f"no gradient for {', '.join(missing)} (defined but not used in forward, or detached)")
    if nonfinite:
        problems.append(f"non-finite gradients in {', '.join(nonfinite)} (first non-finite module: {tracker.first})")
    if all_zero:
        problems.append(f"all-zero gradients for {', '.join(all_zero)}")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    return measured


def check_optimizer_update(ctx: Context) -> dict:
    """One step of the run's optimizer through the shared training step changes every parameter."""
    model = copy.deepcopy(ctx.model)
    model.train()
    train = ctx.params.train
    try:
        optimizer = train_step.make_optimizer(model, train)
    except ValueError as exc:
        ctx.summary["param_update_max"] = 0.0
        raise CheckFailed(str(exc), {"max_change": 0.0}) from None
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ctx.seed_all(4)
    result = train_step.training_step(model, optimizer, *ctx.batch, train.lr, train.precision, train.grad_clip)
    changes = {n: float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters()}
    unchanged = [n for n, c in changes.items() if c == 0.0]
    max_change = max(changes.values())
    ctx.summary["param_update_max"] = max_change
    measured = {"lr": train.lr, "loss": result.loss, "grad_norm": result.grad_norm, "stepped": result.stepped,
                "max_change": max_change, "unchanged": unchanged}
    if not result.stepped:
        raise CheckFailed(f"the step was skipped: loss {result.loss}, gradient norm {result.grad_norm}", measured)
    if max_change == 0.0:
        raise CheckFailed("one training step changed no parameter", measured)
    if unchanged:
        raise CheckFailed(f"one training step left {', '.join(unchanged)} unchanged", measured)
    return measured


CHECKS: tuple[Check, ...] = (
    Check("environment", check_environment, (), "informational", ()),
    Check("files", check_files, (), "every required artifact exists, is non-empty and matches meta.json",
          ("a stage did not run or was interrupted: run `dvc repro encode`", "an artifact was edited or replaced by hand")),
    Check("tokenizer", check_tokenizer, ("files",),
          "every stored ID of every split decodes to exactly its clean text and re-encodes to the same IDs",
          ("tokenizer file swapped or rebuilt after encode (different character order)",
           "encode ran with a different tokenizer: rerun `dvc repro encode`", "clean text changed after encoding")),
    Check("token_ids", check_token_ids, ("files",),
          lambda c: (f"0 <= id < vocab_size ({c.tokenizer.vocab_size}) and at least model.block_size + 1 = "
                     f"{c.model_config.block_size + 1} tokens in every split"),
          ("data encoded with a different, larger vocabulary", "off-by-one: an ID equal to vocab_size",
           "IDs overflowed a too-small dtype", "a split too short for one window (tiny corpus, huge block_size)")),
    Check("batch_shift", check_batch_shift, ("token_ids",),
          "inputs, targets: same shape [B, T], torch.long, on the model's device; inputs[:, 1:] == targets[:, :-1]",
          ("targets not shifted (inputs == targets: the model learns to copy)", "shifted the wrong way or by more than one",
           "batch left on the CPU while the model is on the accelerator", "IDs cast to float")),
    Check("forward_shapes", check_forward_shapes, ("batch_shift",), "logits [B, T, V]; loss a finite scalar",
          ("wrong reshape/transpose in attention", "head sized for another vocabulary", "NaN from a bad init or mask")),
    Check("initial_loss", check_initial_loss, ("forward_shapes",),
          lambda c: f"|loss - log(V)| <= {c.params.preflight.initial_loss_tolerance} nats",
          ("above: extreme initial logits (init too large), targets not matching inputs, loss on wrong IDs",
           "below: future tokens visible (causal mask), unshifted targets, loaded weights instead of a fresh init")),
    Check("causal_independence", check_causal_independence, ("forward_shapes",),
          f"prefix logits unchanged by a new suffix (atol {CAUSAL_ATOL}); d logits[t] / d emb[t' > t] <= {CAUSAL_GRAD_ATOL}",
          ("attention without causal masking (is_causal / mask missing)", "mask built the wrong way round or offset by one",
           "a layer mixing positions (e.g. normalisation over time)")),
    Check("gradients", check_gradients, ("forward_shapes",),
          "no frozen parameter; every parameter gets a finite, non-zero gradient (the run's precision)",
          ("a layer defined but not used in forward", "parameters frozen (requires_grad=False)",
           "a tensor detached from the graph (.detach(), .item(), numpy round trip)", "NaN/Inf from an overflow")),
    Check("optimizer_update", check_optimizer_update, ("forward_shapes",),
          "one step of the run's training step and optimizer changes every parameter",
          ("all parameters frozen", "optimizer built over the wrong parameter list", "learning rate 0",
           "zero_grad called between backward and step")),
    Check("lr_stability", check_lr_stability, ("forward_shapes", "optimizer_update"),
          lambda c: (f"the run's step, schedule and precision: {rehearsal_warmup(c)} warmup steps, then "
                     f"{c.params.preflight.rehearsal_steps} steps near the peak lr {c.params.train.lr:g} "
                     f"(batch {c.params.preflight.batch_size}): finite; LRs in (0, peak], the peak reached; the "
                     f"running median of {2 * SUSTAIN - 1} step losses never above the first + "
                     f"{c.params.preflight.lr_rise_tolerance}; fixed-batch loss lower after than before"),
          ("learning rate too high for this model/batch", "no gradient clipping",
           "warmup needed (instability starts at the peak LR)", "a broken LR schedule (cosine_with_warmup)")),
    Check("rehearsal_learns", check_rehearsal_learns, ("lr_stability",),
          lambda c: (f"after the rehearsal, the loss on {c.params.preflight.probe_batches} fixed train batches <= "
                     f"the loss of train's character frequencies on them - {c.params.preflight.learn_margin}"),
          ("updates never reach the weights (zero_grad between backward and step, optimizer over other tensors)",
           "learning rate far too low, or a schedule that sends it to zero", "gradients cut (detach / no_grad)",
           "inputs and targets misaligned, so there is nothing to learn")),
    Check("single_batch_overfit", check_single_batch_overfit, ("forward_shapes", "optimizer_update", "causal_independence"),
          lambda c: (f"fresh debug model, one batch, {c.params.preflight.overfit_steps} steps of the run's training "
                     f"step ({c.params.train.precision}): final loss < {c.params.preflight.overfit_threshold}"),
          ("the model cannot learn: broken residuals, wrong targets, or a bug in the loss", "learning rate far too low or too high",
           "data pipeline feeding different batches each step")),
)


def build_report(ctx: Context, results: list[CheckResult], fingerprints: dict) -> dict:
    env = next((r.measured for r in results if r.name == "environment"), {})
    total = sum(r.seconds for r in results)
    report = {
        "passed": all(r.status == "passed" for r in results),
        "failed": [r.name for r in results if r.status == "failed"],
        "skipped": [r.name for r in results if r.status == "skipped"],
        "checks": [r.to_dict() for r in results],
        **{name: ctx.summary.get(name) for name in SUMMARY_FIELDS},
        "environment": env,
        "seconds": {"total": round(total, 3),
                    "without_overfit": round(total - sum(r.seconds for r in results if r.name == "single_batch_overfit"), 3)},
        "config": gated_config(ctx.params),
        "fingerprints": fingerprints,
    }
    report["report_digest"] = canonical_json_digest(report)
    return report


def discard_report(path: Path) -> None:
    """Remove a previous report before any check runs: no path (a crash, Ctrl-C) can leave an old one standing."""
    path.unlink(missing_ok=True)


def run_preflight(params: Params, root: Path = Path("."), report_path: Path | None = None, **context_overrides) -> dict:
    """Run every check on the real artifacts under root, write the report atomically, return it."""
    report_path = report_path or root / DEBUG_REPORT
    discard_report(report_path)
    # bound before the checks run: the report vouches for the data, config and code that were checked
    fingerprints = current_fingerprints(params, root)
    device = select_device(params.train.device)
    tokenizer_vocab = None
    try:
        tokenizer_vocab = CharTokenizer.load(root / TOKENIZER_FILE).vocab_size
    except MinigptError:
        pass
    model_config = MiniGPTConfig.from_params(params.model, tokenizer_vocab or 1)
    ctx = Context(params=params, root=root, device=device, model_config=model_config, **context_overrides)
    torch.manual_seed(params.preflight.seed)
    results = run_checks(ctx, CHECKS)
    report = build_report(ctx, results, fingerprints)
    atomic_write_json(report_path, report)
    return report
