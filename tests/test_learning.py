"""benchmarks/learning.py's test-split loss: the per-token cross-entropy that tells settings apart where BLEU on a
few hundred sentences cannot."""

import json

from benchmarks.learning import test_loss as split_loss


def test_a_splits_loss_is_the_dev_loss_training_logged_when_the_split_is_the_dev_split(tiny_run, data_dir):
    # tiny_run's dev, test and train splits are the same 64 de-en pairs, and its last log line is the final
    # evaluation of the weights checkpoint.pt holds: the loss over the test split must be that dev loss
    logged = json.loads((tiny_run / "train_log.jsonl").read_text().splitlines()[-1])["dev_loss"]
    measured = split_loss(tiny_run / "checkpoint.pt", str(data_dir / "test.tsv"), "de-en", threads=1)
    assert abs(measured - logged) < 1e-4 * max(1.0, logged)


def test_the_reverse_direction_is_scored_from_its_own_side(tiny_run, data_dir):
    # the tiny model learned de->en only: scoring en->de pairs (English source, German target) must cost far more
    forward = split_loss(tiny_run / "checkpoint.pt", str(data_dir / "test.tsv"), "de-en", threads=1)
    reverse = split_loss(tiny_run / "checkpoint.pt", str(data_dir / "test.tsv"), "en-de", threads=1)
    assert reverse > forward + 1.0
