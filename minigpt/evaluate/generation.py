"""Stage generate (reports/samples.md, reports/generation.json) and an ad-hoc sampling command.

    python -m minigpt.evaluate.generation --prompt "The " --temperature 0.8 --top-k 40 \
        [--checkpoint models/mini_gpt_best.pt]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from minigpt.core.config import DEFAULT_PARAMS, MAX_NEW_TOKENS, CleanConfig, load_params
from minigpt.core.errors import ConfigError, MinigptError
from minigpt.core.paths import BEST_CHECKPOINT as BEST
from minigpt.core.paths import ENCODED_DIR, SOFT_TARGETS_DIR, TOKENIZER_FILE
from minigpt.core.provenance import Custody
from minigpt.data.clean import normalise
from minigpt.data.encode import load_ids
from minigpt.data.soft_target_files import NextTokenNgram, load_soft_targets_summary, require_trained_ngram
from minigpt.data.textstats import repetition_metrics
from minigpt.data.tokenizer_files import Tokenizer
from minigpt.evaluate.generation_checks import ContextProbe, generation_checks
from minigpt.model.checkpoint import load_trained_model
from minigpt.model.devices import select_device
from minigpt.model.mode_probe import ModeProbe
from minigpt.model.sampling import SamplingSettings, sample_chunks, sample_text


def prepare_prompt(prompt: str, index: int, tokenizer: Tokenizer, clean: CleanConfig) -> str:
    """Apply the clean stage's normalisation; a character outside the vocabulary is an error, never a silent
    placeholder."""
    text = normalise(prompt, clean)
    unknown = tokenizer.unknown_characters(text)
    if unknown:
        shown = ", ".join(f"{ch!r} (U+{ord(ch):04X})" for ch in unknown[:5])
        raise ConfigError(f"'generate.prompts[{index}]' = {prompt!r} has characters outside the vocabulary: {shown}. "
                          "Remove or replace them (the model never saw them in training).")
    return text


def load_for_generation(checkpoint_path: Path, root: Path, device: torch.device):
    """(model, tokenizer, the n-gram it mixes in: model.ngram_expert's, else None)."""
    trained = load_trained_model(checkpoint_path, root / TOKENIZER_FILE, device)
    return trained.model, trained.tokenizer, expert_ngram(trained, root, str(checkpoint_path))


def expert_ngram(trained, root: Path, source: str, custody: Custody | None = None) -> NextTokenNgram | None:
    """model.ngram_expert: the n-gram counted on encoded train, refused unless data/soft_targets holds the one the
    checkpoint was trained with; None for any other model. `custody` (the stage's record) checks and records both."""
    if not trained.model.config.ngram_expert:
        return None
    folder, encoded = root / SOFT_TARGETS_DIR, root / ENCODED_DIR
    if custody is not None:
        custody.take("n-gram summary")
        custody.take("n-gram train ids")
    summary = load_soft_targets_summary(folder, encoded)
    require_trained_ngram(trained.checkpoint, summary, source)
    train = load_ids(encoded, "train")
    if custody is not None:
        custody.used("n-gram train ids", train)
    return NextTokenNgram(train, summary)


def generate_samples(params, root: Path, checkpoint_path: Path | None = None,
                     custody: Custody | None = None) -> tuple[dict, str]:
    """Validate every setting, then sample each prompt; returns (generation.json content, samples.md text).
    `custody`: the stage's record (the n-gram's inputs under model.ngram_expert are checked into it)."""
    gen = params.generate
    settings = SamplingSettings(gen.temperature, gen.top_k, gen.top_p, gen.repetition_penalty)
    device = select_device(params.train.device)
    path = checkpoint_path or root / BEST
    trained = load_trained_model(path, root / TOKENIZER_FILE, device)
    model, tokenizer = trained.model, trained.tokenizer
    ngram = expert_ngram(trained, root, str(path), custody)
    settings.validate(tokenizer.vocab_size)
    prompts = [prepare_prompt(p, i, tokenizer, params.clean) for i, p in enumerate(gen.prompts)]
    samples = []
    # observed from outside the sampler: each module's mode, and each forward pass's positions
    with ModeProbe(model) as mode, ContextProbe(model, model.config.block_size) as context:
        for i, prompt in enumerate(prompts):
            text = sample_text(model, tokenizer, prompt, settings, gen.max_new_tokens, gen.seed + i, device, ngram)
            samples.append({"prompt": prompt, "text": text, **repetition_metrics(text)})
    checks = generation_checks(settings, tokenizer.vocab_size, Path(path) == root / BEST,
                               (trained.checkpoint.get("tokenizer_fingerprint", ""), tokenizer.fingerprint), mode,
                               context, samples, str(path))
    keys = ("repeated_4gram_share", "repeated_8gram_share", "longest_repeated_substring", "longest_char_run")
    report = {
        "settings": {"temperature": gen.temperature, "top_k": gen.top_k, "top_p": gen.top_p,
                     "repetition_penalty": gen.repetition_penalty, "max_new_tokens": gen.max_new_tokens,
                     "seed": gen.seed, "checkpoint": str(path),
                     "prompt_policy": "clean normalisation; unknown characters rejected"},
        "mean": {k: round(sum(s[k] for s in samples) / len(samples), 4) for k in keys},
        "samples": samples,
        "checks": checks,
    }
    lines = ["# Samples", "", f"Checkpoint `{path}`; temperature {gen.temperature}, top_k {gen.top_k}, top_p "
             f"{gen.top_p}, repetition_penalty {gen.repetition_penalty}, {gen.max_new_tokens} new characters, seed "
             f"{gen.seed}.", ""]
    for i, s in enumerate(samples, 1):
        lines += [f"## Prompt {i}: {s['prompt']!r}", "", "```", s["prompt"] + s["text"], "```", "",
                  f"repeated 4-grams {s['repeated_4gram_share']:.1%}, longest repeated substring "
                  f"{s['longest_repeated_substring']} chars, longest run of one character {s['longest_char_run']}", ""]
    return report, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minigpt-generate",
                                     description="Sample from a checkpoint and print to stdout.")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--checkpoint", type=Path, default=BEST)
    parser.add_argument("--params", type=Path, default=Path(DEFAULT_PARAMS), help="for the clean settings and defaults")
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--repetition-penalty", type=float)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params)
        gen = params.generate
        pick = lambda value, default: default if value is None else value  # noqa: E731
        settings = SamplingSettings(pick(args.temperature, gen.temperature), pick(args.top_k, gen.top_k),
                                    pick(args.top_p, gen.top_p), pick(args.repetition_penalty, gen.repetition_penalty))
        device = select_device(params.train.device)
        model, tokenizer, ngram = load_for_generation(args.checkpoint, args.root, device)
        settings.validate(tokenizer.vocab_size, "--")
        max_new_tokens = pick(args.max_new_tokens, gen.max_new_tokens)
        if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise ConfigError(f"'--max-new-tokens' = {max_new_tokens} is invalid; it must be between 1 and "
                              f"{MAX_NEW_TOKENS}.")
        if not args.prompt:
            raise ConfigError("'--prompt' is empty; the model needs at least one character to continue.")
        prompt = prepare_prompt(args.prompt, 0, tokenizer, params.clean)
        print(prompt, end="", flush=True)
        for piece in sample_chunks(model, tokenizer, prompt, settings, max_new_tokens, pick(args.seed, gen.seed),
                                   device, prior_of=ngram):
            print(piece, end="", flush=True)
    except MinigptError as exc:
        print(f"[generate] error: {exc}", file=sys.stderr)
        return 1
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
