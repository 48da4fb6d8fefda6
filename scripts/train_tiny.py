"""Train a tiny Llama-architecture checkpoint that has learned something, for quality figures.

Random weights make quality meaningless (every variant agrees with noise). This trains, in a
few minutes on a small CPU, a byte-level BPE tokenizer and a small LlamaForCausalLM on the
standard library's documentation topics (pydoc_data, which ships with Python), holding out
the same last part that quality is measured on by default (tasks/measure/quality.py split).
The folder it writes (save_pretrained: model and tokenizer) loads with model.checkpoint=:

    python scripts/train_tiny.py --out /path/to/tiny-ckpt
    python sweep.py -m model.checkpoint=/path/to/tiny-ckpt phase=prefill,decode backend=eager,onnxruntime

Deterministic for a given machine and thread count (seeded sampling and initialisation).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from tasks.measure.quality import corpus, split  # noqa: E402

SPECIAL = "<|endoftext|>"


def train_tokenizer(text: str, vocab: int):
    """A byte-level BPE tokenizer trained on `text`, as a transformers PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[SPECIAL], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL, unk_token=SPECIAL)


def build(vocab: int, args: argparse.Namespace):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3 // 16 * 16,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // args.head_dim,
        num_key_value_heads=max(1, args.hidden // args.head_dim // 2),  # GQA: two query heads per KV head
        head_dim=args.head_dim,
        max_position_embeddings=args.max_positions,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(config)


def perplexity(model, ids, seq: int, batch: int, limit: int | None = None) -> float:
    """exp(mean next-token loss) over consecutive non-overlapping windows of `seq` tokens."""
    import torch

    n = (len(ids) - 1) // seq
    rows = torch.stack([ids[i * seq : i * seq + seq + 1] for i in range(min(n, limit or n))])
    total, count = 0.0, 0
    model.eval()
    with torch.inference_mode():
        for chunk in rows.split(batch):
            out = model(input_ids=chunk[:, :-1])
            loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum")
            total, count = total + float(loss), count + chunk[:, 1:].numel()
    model.train()
    return math.exp(total / count)


def train(args: argparse.Namespace) -> dict[str, float]:
    import torch

    torch.set_num_threads(args.threads)
    train_text, held_text = split(corpus())
    tokenizer = train_tokenizer(train_text, args.vocab)
    train_ids = torch.tensor(tokenizer(train_text)["input_ids"], dtype=torch.int64)
    held_ids = torch.tensor(tokenizer(held_text)["input_ids"], dtype=torch.int64)
    model = build(len(tokenizer), args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))
    )
    gen = torch.Generator().manual_seed(args.seed)
    print(
        f"train_tiny: {len(train_ids):,} training tokens, {len(held_ids):,} held out, vocab {len(tokenizer)}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, {args.steps} steps of {args.batch}x{args.seq}"
    )
    losses, t0 = [], time.perf_counter()
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(train_ids) - args.seq - 1, (args.batch,), generator=gen)
        rows = torch.stack([train_ids[s : s + args.seq + 1] for s in starts])
        loss = model(input_ids=rows[:, :-1], labels=rows[:, :-1]).loss  # transformers shifts the labels
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            print(f"  step {step + 1:5d}/{args.steps}  loss {loss:.3f}  {time.perf_counter() - t0:6.1f}s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    figures = {
        "first_loss": losses[0],
        "last_loss": sum(losses[-5:]) / len(losses[-5:]),
        "train_ppl": perplexity(model, train_ids, args.seq, args.batch, limit=len(held_ids) // args.seq),
        "held_out_ppl": perplexity(model, held_ids, args.seq, args.batch),
        "seconds": time.perf_counter() - t0,
    }
    print(
        f"train_tiny: wrote {out}; perplexity train {figures['train_ppl']:.2f}, held-out {figures['held_out_ppl']:.2f} "
        f"(loss {figures['first_loss']:.2f} -> {figures['last_loss']:.2f}) in {figures['seconds']:.0f}s"
    )
    return figures


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder to write the checkpoint (model and tokenizer) to")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128, help="training window, tokens")
    p.add_argument("--lr", type=float, default=6e-3)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--max-positions", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    train(parse())
