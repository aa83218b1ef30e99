"""bench/peer_trl.py end to end on the tiny random model: both arms train a step, the held-out arms are played, and
the side-by-side table and JSON carry every key. Skipped where trl (the `peer` extra) is not installed.

The tiny random model never writes a boxed cup, so every return would be 0 and every group a tie (no update in
either arm); here each episode's return is replaced by its play index's parity (plays 0, 2 lose, 1, 3 win), so
every group has variance and both arms must move their LoRA weights (lora_B starts at zero)."""
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

trl = pytest.importorskip("trl", reason="trl not installed (pip install -e '.[peer]')")

import peer_trl  # noqa: E402
import spade_mini  # noqa: E402


def test_both_arms_train_and_the_table_has_every_key(tmp_path, monkeypatch, capsys):
    real = spade_mini.play

    def play(*args, **kwargs):
        episodes = real(*args, **kwargs)
        for ep in episodes:
            ep.episode_return = float(ep.spec.key[-1] % 2)   # training keys end in the play index
        return episodes
    monkeypatch.setattr(spade_mini, "play", play)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FutureWarning)
        result = peer_trl.main(["--model", "tiny-random", "--steps", "1", "--plays", "4", "--episodes", "2",
                                "--trl-micro-batch", "4", "--out", str(tmp_path)])
    # the config's own name for it (transformers 5.25 renamed it; trl's internals still use the old one)
    assert not [w for w in caught if "`gradient_checkpointing` is deprecated" in str(w.message)]
    assert (tmp_path / "peer_trl.json").is_file()
    for name in ("spade_mini", "trl"):
        arm = result["arms"][name]
        assert arm["steps"] == 1 and arm["lora_b_norm"] > 0, (name, arm)   # the adapter moved off zero
        assert {key for _, key in peer_trl.TABLE} <= set(arm)
        assert arm["generated_tokens"] > 0 and arm["processed_tokens"] > 0 and arm["peak_rss_mb"] > 0
        assert arm["train_return_by_step"] == [0.5]   # 2 of 4 plays win in each game
    assert set(result["ratios"]) == {key for _, key in peer_trl.TABLE}
    for s in ("seen", "unseen"):
        assert {"base", "spade_mini", "trl", "random", "oracle"} <= set(result[s]["arms"])
        assert set(result[s]["vs_random"]) == {"spade_mini", "trl"}
    assert result["trl_changes"] and all(result[k] for k in ("machine", "commit", "command"))
    printed = capsys.readouterr().out
    assert "name: spade-mini | trl | trl/spade-mini" in printed
    for label, _ in peer_trl.TABLE:
        assert f"\n{label}: " in printed
