"""Stage generate (reports/samples.md, reports/generation.json) and an ad-hoc sampling command.

    python -m minigpt.evaluate.generation --prompt "The " --temperature 0.8 --top-k 40 [--checkpoint models/mini_gpt_best.pt]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from minigpt.core.config import DEFAULT_PARAMS, MAX_NEW_TOKENS, CleanConfig, load_params
from minigpt.core.errors import ConfigError, MinigptError
from minigpt.core.paths import BEST_CHECKPOINT as BEST
from minigpt.core.paths import TOKENIZER_FILE
from minigpt.data.clean import normalise
from minigpt.data.textstats import repetition_metrics
from minigpt.data.tokenizer import CharTokenizer
from minigpt.model.checkpoint import load_checkpoint, model_from_checkpoint, require_tokenizer
from minigpt.model.devices import select_device
from minigpt.model.sampling import SamplingSettings

STREAM_CHUNK = 32  # the CLI prints as it samples, this many characters at a time


def prepare_prompt(prompt: str, index: int, tokenizer: CharTokenizer, clean: CleanConfig) -> str:
    """Apply the clean stage's normalisation; a character outside the vocabulary is an error, not a silent placeholder."""
    text = normalise(prompt, clean)
    unknown = [ch for ch in dict.fromkeys(text) if ch not in set(tokenizer.chars)]
    if unknown:
        shown = ", ".join(f"{ch!r} (U+{ord(ch):04X})" for ch in unknown[:5])
        raise ConfigError(f"'generate.prompts[{index}]' = {prompt!r} has characters outside the vocabulary: {shown}. "
                          "Remove or replace them (the model never saw them in training).")
    return text


def load_for_generation(checkpoint_path: Path, root: Path, device: torch.device):
    checkpoint = load_checkpoint(checkpoint_path)
    tokenizer = CharTokenizer.load(root / TOKENIZER_FILE)
    require_tokenizer(checkpoint, tokenizer.fingerprint, str(checkpoint_path))
    return model_from_checkpoint(checkpoint, device, str(checkpoint_path)), tokenizer


def sample_chunks(model, tokenizer, prompt: str, settings: SamplingSettings, max_new_tokens: int, seed: int,
                  device: torch.device, chunk: int = STREAM_CHUNK):
    """Yield the sampled text piece by piece (every `chunk` characters) from one sampling stream, so the pieces
    join to exactly what one call samples."""
    ids = torch.as_tensor(tokenizer.encode(prompt), dtype=torch.long, device=device)[None, :]
    generator = torch.Generator(device=device).manual_seed(seed)
    pending: list[int] = []
    for next_id in model.generate_stream(ids, max_new_tokens, settings, generator):
        pending.append(int(next_id[0, 0]))
        if len(pending) == chunk:
            yield tokenizer.decode(pending)
            pending = []
    if pending:
        yield tokenizer.decode(pending)


def sample_text(model, tokenizer, prompt: str, settings: SamplingSettings, max_new_tokens: int, seed: int,
                device: torch.device) -> str:
    return "".join(sample_chunks(model, tokenizer, prompt, settings, max_new_tokens, seed, device,
                                 chunk=max(1, max_new_tokens)))


def generate_samples(params, root: Path, checkpoint_path: Path | None = None) -> tuple[dict, str]:
    """Validate every setting, then sample each prompt; returns (generation.json content, samples.md text)."""
    gen = params.generate
    settings = SamplingSettings(gen.temperature, gen.top_k, gen.top_p, gen.repetition_penalty)
    device = select_device(params.train.device)
    path = checkpoint_path or root / BEST
    model, tokenizer = load_for_generation(path, root, device)
    settings.validate(tokenizer.vocab_size)
    prompts = [prepare_prompt(p, i, tokenizer, params.clean) for i, p in enumerate(gen.prompts)]
    samples = []
    for i, prompt in enumerate(prompts):
        text = sample_text(model, tokenizer, prompt, settings, gen.max_new_tokens, gen.seed + i, device)
        samples.append({"prompt": prompt, "text": text, **repetition_metrics(text)})
    keys = ("repeated_4gram_share", "repeated_8gram_share", "longest_repeated_substring", "longest_char_run")
    report = {
        "settings": {"temperature": gen.temperature, "top_k": gen.top_k, "top_p": gen.top_p,
                     "repetition_penalty": gen.repetition_penalty, "max_new_tokens": gen.max_new_tokens,
                     "seed": gen.seed, "checkpoint": str(path), "prompt_policy": "clean normalisation; unknown characters rejected"},
        "mean": {k: round(sum(s[k] for s in samples) / len(samples), 4) for k in keys},
        "samples": samples,
    }
    lines = ["# Samples", "", f"Checkpoint `{path}`; temperature {gen.temperature}, top_k {gen.top_k}, top_p "
             f"{gen.top_p}, repetition_penalty {gen.repetition_penalty}, {gen.max_new_tokens} new characters, seed {gen.seed}.", ""]
    for i, s in enumerate(samples, 1):
        lines += [f"## Prompt {i}: {s['prompt']!r}", "", "```", s["prompt"] + s["text"], "```", "",
                  f"repeated 4-grams {s['repeated_4gram_share']:.1%}, longest repeated substring "
                  f"{s['longest_repeated_substring']} chars, longest run of one character {s['longest_char_run']}", ""]
    return report, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minigpt-generate", description="Sample from a checkpoint and print to stdout.")
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
        model, tokenizer = load_for_generation(args.checkpoint, args.root, device)
        settings.validate(tokenizer.vocab_size, "--")
        max_new_tokens = pick(args.max_new_tokens, gen.max_new_tokens)
        if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise ConfigError(f"'--max-new-tokens' = {max_new_tokens} is invalid; it must be between 1 and {MAX_NEW_TOKENS}.")
        if not args.prompt:
            raise ConfigError("'--prompt' is empty; the model needs at least one character to continue.")
        prompt = prepare_prompt(args.prompt, 0, tokenizer, params.clean)
        print(prompt, end="", flush=True)
        for piece in sample_chunks(model, tokenizer, prompt, settings, max_new_tokens, pick(args.seed, gen.seed), device):
            print(piece, end="", flush=True)
    except MinigptError as exc:
        print(f"[generate] error: {exc}", file=sys.stderr)
        return 1
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
