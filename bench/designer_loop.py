"""The designer half in the loop, kept: `spade-mini train --preset cpu-1.5b` (Qwen2.5-Coder-1.5B in both roles),
then what each window's designer did, read back from the run's own files.

    python bench/designer_loop.py                              # 4 windows into runs/designer_loop, then the table
    python bench/designer_loop.py --run runs/designer_loop     # the table of a run already made (no model)
    python bench/designer_loop.py --run runs/designer_loop --compare 18   # + untrained vs final adapter

Per window: the programs written, valid and novel valid (the copy check, evaluate.copy_similarity, against the
prompt's example, every program of earlier windows and the memory), the rejection reasons, each model-written
environment that was played (unhinted and hinted plays, R_nohint, R_hint, regret, designer reward and
advantage), the designer rewards' spread, the samples each role trained with their gradient norms, what
entered the memory, and the seconds of each part. Writes bench/results/designer_loop.json and copies the run,
without its checkpoints (the adapter stays in --run), to bench/results/designer_loop_run/.

--compare N: on the same documents and skills (the first window's seed and step), the untrained model and the
run's final adapter each write N programs, which are validated, hinted and played as the loop does (the same
weights as agent): valid share and novel-valid share with exact (Clopper-Pearson) 95% intervals, mean regret
of the valid ones with a bootstrap interval. And the agent (the same weights): its unhinted return on the run's
own valid model-written environments, at their first play (in their window, as the run logged it) and in each
arm on new seeds; and on the learning bench's unseen games (bench/heldout/, the run's agent prompt and limits),
beside a random valid action and the games' own solution() on the same seeds.
"""
from __future__ import annotations

import argparse
import collections
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--run", default="runs/designer_loop", help="the run directory (made, or resumed, unless "
                    "--no-train)")
    ap.add_argument("--windows", type=int, default=4, help="steps of the run (the preset's window is one step)")
    ap.add_argument("--no-train", action="store_true", help="only read --run")
    ap.add_argument("--compare", type=int, default=0, help="programs per arm of the untrained/final comparison")
    ap.add_argument("--agent-plays", type=int, default=2, help="--compare: unhinted plays per model-written "
                    "environment in each arm")
    ap.add_argument("--unseen-episodes", type=int, default=16, help="--compare: episodes per arm on the learning "
                    "bench's unseen games (bench/heldout/)")
    ap.add_argument("--keep", action="store_true", help="write bench/results/designer_loop.json and the run copy")
    return ap


# -----------------------------------------------------------------------------------------------------------
# exact intervals

def bootstrap_mean(values: list[float], seed: int = 0) -> list[float] | None:
    """evaluate.bootstrap_ci of a list that may be empty (None)."""
    import numpy as np
    import evaluate
    return evaluate.bootstrap_ci(values, np.random.default_rng(seed)) if values else None


# -----------------------------------------------------------------------------------------------------------
# the table, from the run directory alone

def novel(code: str, references: list[str]) -> tuple[bool, float]:
    import evaluate
    similarity = evaluate.copy_similarity(code, references) if references else 0.0
    return similarity < evaluate.COPY_SIMILARITY, round(similarity, 3)


def window_rows(run: Path) -> list[dict]:
    import envs
    import runs
    samples = list(runs.read_jsonl(run / "samples.jsonl"))
    metrics = {r["step"]: r for r in runs.read_jsonl(run / "metrics.jsonl") if "step" in r}
    memory = json.loads((run / "memory.json").read_text()) if (run / "memory.json").exists() else {}
    records = memory.get("records", memory) if isinstance(memory, dict) else memory
    earlier, rows = [envs.example_program("games")], []
    for start in sorted({s["step"] for s in samples if s["kind"] == "design"}):
        designs = [s for s in samples if s["kind"] == "design" and s["step"] == start]
        m = metrics.get(start, {})
        last = metrics.get(start + m.get("window/length", 1) - 1, m)
        # the designed environments' records, in the order of the window record's input (train.score's)
        played = [s for s in samples if s["kind"] == "env" and s.get("origin") == "designer"
                  and s["env_id"].startswith(f"env_{start:05d}_")]
        window = next((s for s in samples if s["kind"] == "window" and s["start"] == start and s["designed"]), None)
        played = {s["env_id"]: _env_row(s, window["input"]["envs"][k] if window else None)
                  for k, s in enumerate(played)}
        # --invalid-samples: the rejected programs' entries in the window record, by slot and attempt (older runs
        # logged neither: then in design order, which holds while every rejected program wrote a token)
        scored = zip(window["input"]["envs"], window["output"]["envs"]) if window else []
        paid_for = [(given.get("slot"), given.get("attempt"), out) for given, out in scored if given.get("invalid")]
        in_order = iter(out for _, _, out in paid_for)
        programs = []
        for d in designs:
            fresh, similarity = novel(d["code"], earlier) if d["verdict"]["valid"] else (False, None)
            env = played.get(f"env_{start:05d}_{d['slot']:02d}") if d["verdict"]["valid"] else None
            keyed = [out for slot, attempt, out in paid_for if (slot, attempt) == (d["slot"], d["attempt"])]
            paid = None if d["verdict"]["valid"] else keyed[0] if keyed else next(in_order, None)
            programs.append({"slot": d["slot"], "skill": d["skill"], "valid": d["verdict"]["valid"],
                             "reason": d["verdict"]["reason"], "novel": fresh, "max_similarity": similarity,
                             "class": d["verdict"].get("class_name"), "env": env,
                             "rejected_reward": paid and paid["designer_reward"],
                             "rejected_advantage": paid and paid["designer_advantage"]})
        earlier += [d["code"] for d in designs if d["verdict"]["valid"]]
        rewards = [p["env"]["designer_reward"] for p in programs if p["env"]]
        rows.append({
            "window": start, "skills": m.get("skills"), "written": len(designs),
            "valid": sum(p["valid"] for p in programs), "novel_valid": sum(p["novel"] for p in programs),
            "rejections": dict(collections.Counter(p["reason"] for p in programs if not p["valid"])),
            "programs": programs,
            "designer_reward_spread": round(max(rewards) - min(rewards), 4) if rewards else None,
            "designer_samples": last.get("loss/samples_designer"),
            "designer_samples_valid": sum(bool(p["env"] and p["env"]["designer_advantage"]) for p in programs),
            "designer_samples_rejected": sum(bool(p["rejected_advantage"]) for p in programs),
            "designer_grad_norm": last.get("loss/grad_norm_designer"),
            "agent_samples": last.get("loss/samples_agent"), "agent_grad_norm": last.get("loss/grad_norm_agent"),
            "entered_memory": [r["env_id"] for r in records if r.get("step") == start],
            "seconds": {k.split("/")[1][:-2]: round(v, 1) for k, v in m.items()
                        if k.startswith("perf/") and k.endswith("_s") and isinstance(v, (int, float))},
            "train_tok_per_s": last.get("perf/train_tok_per_s")})
    return rows


def _env_row(env: dict, given: dict | None) -> dict:
    """One played model-written environment: its plays (the window record's input), its scores, and whether its
    agent plays were trained (a non-zero advantage: their returns did not all tie)."""
    plays = {"unhinted": sum(len(s) for s in given["unhinted"]), "hinted": len(given["hinted"])} if given else {}
    return {"env_id": env["env_id"], **plays, **{k: env.get(k) for k in (
        "r_nohint", "r_hint", "regret", "w", "designer_reward", "designer_advantage", "hung", "guard", "loc",
        "opening_leak", "hint_leak")},
        "agent_trained": any(a != 0 for step in env.get("agent_advantages") or [] for a in step)}


def totals(rows: list[dict]) -> dict:
    played = [p for r in rows for p in r["programs"] if p["novel"] and p["env"] and p["env"]["unhinted"]]
    trained = [p for p in played if p["env"]["designer_advantage"]]
    return {"windows": len(rows), "written": sum(r["written"] for r in rows), "valid": sum(r["valid"] for r in rows),
            "novel_valid": sum(r["novel_valid"] for r in rows), "novel_valid_played": len(played),
            "novel_valid_played_designer_trained": len(trained),
            "novel_valid_played_agent_trained": sum(p["env"]["agent_trained"] for p in played),
            "novel_valid_played_either_trained": sum(p["env"]["agent_trained"] or bool(p["env"]["designer_advantage"])
                                                     for p in played),
            "windows_with_designer_gradient": sum(bool(r["designer_samples"]) for r in rows),
            "windows_with_designer_gradient_on_a_valid_program": sum(bool(r.get("designer_samples_valid"))
                                                                     for r in rows),
            "target_8_novel_valid_played": len(played) >= 8,
            "target_half_windows_designer_gradient": sum(bool(r["designer_samples"]) for r in rows) * 2 >= len(rows)}


def print_table(rows: list[dict], total: dict) -> None:
    print("window skills                                   written valid novel  spread  n_des |g_des| n_agt |g_agt|"
          "  design   hint   play update   step (s)")
    for r in rows:
        s = r["seconds"]
        print(f"{r['window']:>6} {', '.join(r['skills'] or [])[:40]:<40} {r['written']:>7} {r['valid']:>5} "
              f"{r['novel_valid']:>5} {_f(r['designer_reward_spread'])} {r['designer_samples'] or 0:>6} "
              f"{_f(r['designer_grad_norm'])} {r['agent_samples'] or 0:>5} {_f(r['agent_grad_norm'])} "
              + " ".join(f"{s.get(k, 0):>6.0f}" for k in ("design", "hint", "play", "update", "step")))
        for p in r["programs"]:
            e = p["env"] or {}
            print(f"         slot {p['slot']} {p['skill'][:22]:<22} {p['reason']:<18} {p['class'] or '':<26}"
                  + (f" R_nohint {e['r_nohint']:.2f} R_hint {e['r_hint']:.2f} regret {e['regret']:+.2f} "
                     f"reward {e['designer_reward']:+.2f} adv {e['designer_advantage']:+.2f}"
                     f" agent {'trained' if e['agent_trained'] else 'tied'}" if e
                     else f" reward {p['rejected_reward']:+.2f} adv {p['rejected_advantage']:+.2f}"
                     if p.get("rejected_reward") is not None else ""))
        print(f"         rejected: {r['rejections']}; into the memory: {r['entered_memory']}")
    print(json.dumps(total))


def _f(x) -> str:
    return f"{x:>6.3f}" if isinstance(x, (int, float)) else f"{'-':>6}"


# -----------------------------------------------------------------------------------------------------------
# untrained vs the final adapter, on the same documents and skills

def played_programs(run: Path, rows: list[dict]) -> list[dict]:
    """The run's valid model-written environments (rows: window_rows(run)): window, id, code and the unhinted
    return of their first play."""
    return [{"window": row["window"], "env_id": p["env"]["env_id"], "r_nohint_first": p["env"]["r_nohint"],
             "code": (run / "envs" / f"step_{row['window']:05d}" / f"{p['env']['env_id']}.py").read_text()}
            for row in rows for p in row["programs"] if p["env"]]


def mean_with_interval(values: list[float], count: str = "episodes", mean: str = "mean_return") -> dict:
    """{count: how many, mean: their mean, "ci95": its bootstrap interval} (None, None when there are none)."""
    return {count: len(values), mean: round(sum(values) / len(values), 4) if values else None,
            "ci95": bootstrap_mean(values)}


def agent_returns(model, tok, cfg, written: list[dict], plays: int, unseen: list, seed: int) -> dict:
    """One arm's agent: mean unhinted return on the run's model-written environments (`plays` seeds each, the same
    in both arms) and on the learning bench's unseen games (`unseen`: its EpisodeSpecs), with bootstrap
    intervals."""
    import envs
    import learning
    import spade_mini
    specs = [spade_mini.EpisodeSpec(w["code"], envs.derive_seed(seed, -1, "compare-agent", k * plays + i), None, (k,),
                                    cfg.agent_prompt, cfg.agent_reply_prefix)
             for k, w in enumerate(written) for i in range(plays)]
    return {name: mean_with_interval([ep.episode_return for ep in learning.play(model, tok, cfg, chosen, seed)]
                                     if chosen else [])
            for name, chosen in (("model_written", specs), ("unseen", unseen))}


def compare(run: Path, rows: list[dict], n: int, agent_plays: int = 2, unseen_episodes: int = 16) -> dict:
    import envs
    import evaluate
    import learning
    import models
    import regret
    import runs
    import train
    cfg = runs.resumed_config(runs.Config(resume=str(run)))
    cfg = runs.Config(**{**cfg.__dict__, "envs_per_step": n, "skills_per_step": 6, "out": "", "resume": ""})
    model, tok, _ = models.load_model(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                      quantize=cfg.quantize, gradient_checkpointing=cfg.gradient_checkpointing,
                                      cache_dir=cfg.cache_dir, seed=cfg.seed)
    final = runs.Run(str(run)).latest_checkpoint()
    references = [envs.example_program("games")] + [p.read_text() for p in sorted((run / "envs").glob("*/*.py"))]
    written = played_programs(run, rows)
    files = sorted((ROOT / "bench" / "heldout").glob("*.py"))
    unseen = learning.specs(files, unseen_episodes, cfg.seed, "compare-unseen", cfg.agent_prompt, cfg.agent_reply_prefix)
    arms = {}
    for arm in ("untrained", "final"):
        if arm == "final":
            models.load_adapter(model, final)
        t0 = time.time()
        st = train.State(cfg, None, model, tok, None, envs.Memory(Path("/nonexistent/memory.json")),
                         runs.load_corpus(None), [], [], {})
        designs = train.design(st, 0, train.active_skills(cfg, 0))
        played = [train.PlayedEnv(train.env_id(0, d.slot), d.skill, d.code, d) for d in designs if d.verdict.valid]
        train.write_hints(st, 0, played)
        if played:
            train.play_all(st, 0, played, hinted=True)
        given = [dict(skill=e.skill, hung_step=e.hung_step, hinted=e.hinted, unhinted=e.unhinted, trained=e.trained)
                 for e in played]
        out = regret.score_window(cfg.designer_reward, given, {}, 1) if played else {"envs": []}
        fresh = [novel(d.code, references)[0] for d in designs if d.verdict.valid]
        regrets = [row["regret"] for row in out["envs"]]
        k = len(played)
        arms[arm] = {"programs": len(designs), "valid": k, "valid_share": round(k / len(designs), 4),
                     "valid_ci95": evaluate.clopper_pearson(k, len(designs)), "novel_valid": sum(fresh),
                     "novel_valid_ci95": evaluate.clopper_pearson(sum(fresh), len(designs)),
                     "mean_regret_valid": round(sum(regrets) / k, 4) if k else None,
                     "regret_ci95": bootstrap_mean(regrets), "reasons": dict(collections.Counter(
                         d.verdict.reason for d in designs)), "seconds": round(time.time() - t0, 1),
                     "classes": [d.verdict.class_name for d in designs if d.verdict.valid]}
        t1 = time.time()
        arms[arm]["agent"] = agent_returns(model, tok, cfg, written, agent_plays, unseen, cfg.seed)
        arms[arm]["agent"]["seconds"] = round(time.time() - t1, 1)
        print(arm, json.dumps(arms[arm]), flush=True)
    scripted = learning.play_scripted(cfg, tok, unseen, [f.stem for f in files], cfg.seed) if unseen else {}
    return {"adapter": str(final), "programs_per_arm": n, **arms,
            "model_written_first_play": mean_with_interval([w["r_nohint_first"] for w in written], "envs",
                                                           "mean_r_nohint"),
            "unseen_baselines": {policy: mean_with_interval([e.episode_return for e in eps])
                                 for policy, eps in scripted.items() if policy in ("random", "oracle")}}


# -----------------------------------------------------------------------------------------------------------

def main() -> None:
    args = parser().parse_args()
    run = Path(args.run)
    peak_gb = None
    if not args.no_train:
        how = ["--resume", str(run)] if (run / "last_checkpoint.json").exists() else ["--out", str(run)]
        command = [sys.executable, str(ROOT / "cli.py"), "train", "--preset", "cpu-1.5b", "--steps", str(args.windows),
                   *how]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)
        peak_gb = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2)
    rows = window_rows(run)
    total = totals(rows)
    print_table(rows, total)
    result = {"command": " ".join(sys.argv), "run": str(run), "peak_rss_gb_this_call": peak_gb,
              "config": json.loads(next(iter((run / "metrics.jsonl").open())))["config"], "totals": total,
              "windows": rows}
    if args.compare:
        result["compare"] = compare(run, rows, args.compare, args.agent_plays, args.unseen_episodes)
    if args.keep:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "designer_loop.json").write_text(json.dumps(result, indent=1) + "\n")
        kept = RESULTS / "designer_loop_run"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(run, kept, ignore=shutil.ignore_patterns("checkpoints", "last_checkpoint.json", "*.log"))
        print(f"kept: {RESULTS / 'designer_loop.json'} and {kept}")


if __name__ == "__main__":
    main()
