"""The cases of tests/test_dist.py: each runs here in one process (the reference) and under torchrun on 2 gloo
processes (`python -m torch.distributed.run --nproc-per-node 2 tests/two_ranks.py OUT CASE[,CASE...]`), which
saves each rank's results as OUT/CASE_rank<r>.pt."""
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

import models
import runs
import spade_mini as sm
import train

CACHE = os.path.expanduser(os.environ.get("SPADE_MINI_CACHE", "~/.cache/spade-mini"))

# Terminates at turn 1 + seed % 4 with reward 1 (0.1 before); the observation echoes the action's length, so
# different replies lead to different observations and returns.
COUNTER_ENV = '''
class CounterEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.goal, self.turn = 1 + (seed or 0) % 4, 0
        return f"Reach turn {self.goal}. Answer with \\\\boxed{{...}}.", {}

    def step(self, action):
        self.turn += 1
        done = self.turn >= self.goal
        obs = f"turn {self.turn}: your action had {len(action)} characters."
        return obs, 1.0 if done else 0.1 * (len(action) % 3), done, self.turn >= self.max_turns, {}
'''


def tiny(seed: int):
    model, tok, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                      gradient_checkpointing=False, cache_dir=CACHE, seed=seed)
    return model, tok


def fixed_samples(vocab: int, n: int = 5) -> list[sm.Sample]:
    """n random sequences of different lengths whose second half is trained, with advantages of both signs."""
    g = torch.Generator().manual_seed(4)
    out = []
    for i in range(n):
        length = 15 + 7 * i
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        out.append(sm.Sample(ids, [0] * (length // 2) + [1] * (length - length // 2), (-1.0) ** i * (0.5 + i / 4),
                             "agent"))
    return out


def update_case() -> dict:
    """The LoRA weights and metrics after (a) one optimizer step and (b) three steps on shuffled mini-batches
    (of 2, 2 and 1 samples: a rank without samples in the last) with the KL term; micro-batches of <= 64 tokens.

    subtle: plain SGD, not the loop's AdamW: Adam divides by the gradient's own scale, so a weight whose gradient
    is ~0 moves by up to lr whatever the sign of its float noise (measured: 2.6e-5 on one weight of 256 after
    three steps, all others within 1e-6). SGD shows the gradients themselves agree; AdamW then acts the same
    on every rank, as it does on every rank's identical all-reduced gradient."""
    result = {}
    for name, kw in (("one_step", dict(updates=1)), ("three_steps", dict(updates=3, kl_beta=0.1, seed=7))):
        model, tok = tiny(seed=3)
        with torch.no_grad():   # LoRA B starts at 0 (no gradient for A); give it values so that every weight moves
            for k, (n, p) in enumerate(model.named_parameters()):
                if "lora_B" in n:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(k))
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        metrics = sm.update(model, opt, fixed_samples(len(tok)), temperature=0.7, token_budget=64,
                            max_grad_norm=0.5, **kw)
        result[name] = {"weights": {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
                        "metrics": {k: metrics[k] for k in ("loss", "kl", "clip_frac", "grad_norm", "tokens")}}
    return result


def rollout_case() -> dict:
    """Greedy plays of two environments through train.play_all: 3 unhinted and 2 hinted plays each (goals of 2, 3
    and 4 turns at the seeds of step 0; 2 turns allowed)."""
    model, tok = tiny(seed=0)
    cfg = runs.Config(temperature=0.0, top_p=1.0, top_k=0, plays=3, hinted_plays=2, max_turns=2,
                      agent_max_new_tokens=48, agent_max_episode_tokens=128)
    played = [train.PlayedEnv(f"env_{j}", "", COUNTER_ENV, None, hint=f"hint {j}: try a short action")
              for j in range(2)]
    train.play_all(SimpleNamespace(cfg=cfg, model=model, tok=tok), 0, played, hinted=True)
    return {e.env_id: {"hinted": e.hinted, "unhinted": e.unhinted, "trained": e.trained,
                       "episodes": [(ep.spec.key, ep.spec.seed, ep.token_ids, ep.loss_mask, ep.episode_return)
                                    for ep in e.episodes]} for e in played}


def dead_case() -> dict:
    """After both ranks met once more, rank 1 exits; rank 0's next collective must end in one PeerError."""
    models.gather("met", "the last meeting")
    if models.rank() == 1:
        os._exit(0)
    t = time.time()
    try:
        models.gather("alone", "the dead-rank test")
    except runs.PeerError as err:
        return {"error": str(err), "seconds": time.time() - t}
    return {"error": None, "seconds": time.time() - t}


if __name__ == "__main__":
    out, cases = Path(sys.argv[1]), sys.argv[2].split(",")
    models.init_distributed(timeout_s=120.0)
    for case in cases:
        result = {"update": update_case, "rollout": rollout_case, "dead": dead_case}[case]()
        torch.save({"world_size": models.world_size(), **result}, out / f"{case}_rank{models.rank()}.pt")
    if "dead" in cases:   # subtle: a gloo group whose peer died cannot be torn down; at the interpreter's exit its
        os._exit(0)       # threads could abort the survivor (SIGABRT, "terminate called without an active exception")
