"""The generation scheduler (service/worker/generate_scheduler.py), driven directly as the worker loop drives it,
without a server or LitServe, on a small fake engine (sequences leaving at their eos, a stop sequence or a disconnect;
a failing group failing its requests alone) and on models/lm-small (its metrics, requests joining a running batch,
the budget)."""

import time
from pathlib import Path
from types import SimpleNamespace

from service.worker.cancel import CancelBoard
from service.inference.engine import Engine
from service.worker.generate_scheduler import GenerationScheduler, GenJob
from service.worker.scheduler import Failure
from service.shared.options import SearchOptions

from test_translate_scheduler import scheduler_samples

ROOT = Path(__file__).resolve().parent.parent


# --- generation, on a fake engine -----------------------------------------------------------------------

class EchoLM:
    """A generation engine whose every row writes its prompt (less bos) back, one token a step, then eos;
    piece i is the letter chr(96 + i), but "y" has no text (piece_text raises). Beam search returns the
    echo whole, at its first step. Options with top_k 7 raise. Counts the rows of each step's call."""
    eos_id, bos_id, max_positions = 0, 30, 64

    def __init__(self):
        self.rows_per_step: list[int] = []

    def prompt_ids(self, texts):
        return [[self.bos_id] + [ord(c) - 96 for c in text] for text in texts]

    def piece_text(self, ids):
        if 25 in ids:
            raise ValueError("no such piece")
        return "".join(chr(96 + i) for i in ids)

    def generation_batch(self):
        return EchoBatch(self)


class EchoMember:
    """One request's rows in an EchoBatch (as service/inference/lm_batch.py's LmMember is seen)."""

    def __init__(self, scripts, cancel, whole):
        self.scripts, self.cancel, self.whole = scripts, cancel, whole
        self.t, self.done, self.step, self.result, self.error = 0, set(), None, None, None

    def rows(self):
        return [i for i in range(len(self.scripts)) if i not in self.done and i not in self.cancel]


class EchoBatch:
    """EchoLM's running batch: each step one call for the rows of every member (a member joins at the step
    after it is added), each row's next scripted token; a member whose rows all ended leaves."""

    def __init__(self, lm):
        self.lm, self.members, self.call_rows, self.closed = lm, [], [], False
        self.rows = self.bytes = 0

    def join(self, prompts, options, *, seeds=None, cancel=None):
        if options.top_k == 7:
            raise RuntimeError("engine failure")
        whole = ([[SimpleNamespace(tokens=list(p[1:]))] * options.num_hypotheses for p in prompts]
                 if options.beam_size > 1 else None)
        member = EchoMember([list(p[1:]) + [self.lm.eos_id] for p in prompts], cancel, whole)
        self.members.append(member)
        return member

    def step(self):
        self.call_rows = []
        ended = [m for m in self.members if m.whole is not None or not m.rows()]
        for m in ended:
            m.result = m.whole or []
            self.members.remove(m)
        live = [(m, m.rows()) for m in self.members]
        if live:
            self.call_rows = [sum(len(rows) for _, rows in live)]
            self.lm.rows_per_step.append(self.call_rows[0])
        for m, rows in live:
            tokens = [m.scripts[i][m.t] for i in rows]
            m.done |= {i for i, tok in zip(rows, tokens) if tok == self.lm.eos_id}
            m.step, m.t = SimpleNamespace(sentence=rows, tokens=tokens), m.t + 1
        return ended

    def leave(self, member):
        if member in self.members:
            self.members.remove(member)

    def close(self):
        self.closed = True


def gen_job(text: str, request_id: str, *, n: int = 1, stop=(), number: int = -1, beam: int = 1,
            top_k: int = 0) -> GenJob:
    options = SearchOptions(beam_size=beam, num_hypotheses=n if beam > 1 else 1, max_length=33,
                            sampling=beam == 1 and n > 1,
                            top_k=top_k)
    (prompt,) = EchoLM().prompt_ids([text])
    return GenJob(request_id, number, "lm", options, prompt, n, [None] * n, list(stop), 32, time.monotonic(),
                  texts=[""] * n, emitted=[0] * n, tokens=[0] * n, finish=[None] * n)


def run_generation(s: GenerationScheduler, jobs: dict, after_step=lambda s: None) -> tuple[dict, list]:
    """As the worker loop drives it: every request's job once over, and how many were held at each take."""
    s.admit(jobs)
    over, held = {}, []
    while True:
        progress = s.take_progress()
        held.append(len(progress))
        over.update({key: job for key, job, done in progress if done})
        if not s.busy:
            return over, held
        s.step()
        after_step(s)


def test_generation_streams_each_sequence_until_its_eos_and_finished_rows_leave():
    lm = EchoLM()
    s = GenerationScheduler({"lm": lm}, CancelBoard())
    over, held = run_generation(s, {"ab": gen_job("ab", "ab"), "long": gen_job("abcdef", "long")})
    assert over["ab"].texts == ["ab"] and over["long"].texts == ["abcdef"] and over["long"].tokens == [6]
    assert over["ab"].finish == over["long"].finish == ["stop"] and not s.jobs and s.wants_new_requests()
    assert lm.rows_per_step == [2, 2, 2, 1, 1, 1, 1]
    assert held[0] == 2 and held[-1] == 1                   # over, it is reported and the worker is free at once


def test_each_sampled_sequence_is_a_row_of_its_own():
    s = GenerationScheduler({"lm": EchoLM()}, CancelBoard())
    over, _ = run_generation(s, {"two": gen_job("xw", "two", n=2)})
    assert over["two"].texts == ["xw", "xw"] and over["two"].finish == ["stop", "stop"]


def test_a_stop_sequence_ends_its_sequence_and_its_row_leaves():
    lm = EchoLM()
    s = GenerationScheduler({"lm": lm}, CancelBoard())
    over, _ = run_generation(s, {"a": gen_job("abcdefgh", "a", stop=["cd", "zz"])})
    assert over["a"].texts == ["ab"] and over["a"].finish == ["stop"] and over["a"].tokens == [4]
    assert lm.rows_per_step == [1, 1, 1, 1]


def test_a_request_whose_client_went_away_ends_cancelled_and_its_rows_leave():
    board, lm = CancelBoard(), EchoLM()
    s = GenerationScheduler({"lm": lm}, board)

    def cancel_after_two_steps(s):
        if len(lm.rows_per_step) == 2:
            board.cancel(5)

    over, _ = run_generation(s, {"gone": gen_job("abcdefgh", "gone", number=5), "here": gen_job("abcdef", "here")},
                             after_step=cancel_after_two_steps)
    assert over["gone"].finish == ["cancelled"] and over["gone"].texts == ["ab"]   # left before the third call
    assert over["here"].finish == ["stop"] and over["here"].texts == ["abcdef"]
    assert lm.rows_per_step == [2, 2, 1, 1, 1, 1, 1]


def test_a_failing_generation_group_fails_only_its_requests():
    s = GenerationScheduler({"lm": EchoLM()}, CancelBoard())
    refused = Failure(413, "too_many_tokens", "too long")
    s.admit({"refused": refused})
    assert s.take_progress() == [("refused", refused, True)] and not s.jobs    # reported before any step
    over, _ = run_generation(s, {"ok": gen_job("ab", "ok"), "bad": gen_job("ab", "bad", top_k=7),
                                 "beam": gen_job("abc", "beam", n=2, beam=4)})
    assert over["bad"].failure.status == 500 and over["ok"].failure is None and over["ok"].texts == ["ab"]
    assert over["beam"].texts == ["abc", "abc"] and over["beam"].finish == ["stop", "stop"]


def test_a_sequence_whose_text_cannot_be_made_fails_its_request_alone():
    lm = EchoLM()
    s = GenerationScheduler({"lm": lm}, CancelBoard())
    over, _ = run_generation(s, {"bad": gen_job("aaay", "bad"), "ok": gen_job("abcdef", "ok")})
    assert over["bad"].failure.status == 500 and over["ok"].texts == ["abcdef"]
    assert lm.rows_per_step == [2, 2, 2, 2, 1, 1, 1]         # the failed row leaves at the next step



def test_generation_scheduler_metrics_follow_its_rows_requests_cache_and_decoder_calls():
    lm = Engine(ROOT / "models" / "lm-small", device="cpu", intra_op_threads=1)
    s = GenerationScheduler({"lm-small": lm}, CancelBoard())
    before = scheduler_samples("generate", "lm-small")
    prompt = lm.prompt_ids(["Die Datei wird"])[0]
    job = GenJob("g", -1, "lm-small", SearchOptions(beam_size=1, max_length=9, min_length=9), prompt, 1, [None], [],
                 8, time.monotonic(), texts=[""], emitted=[0], tokens=[0], finish=[None])
    s.admit({"g": job})
    assert scheduler_samples("generate", "lm-small")["waiting"] == 1
    s.step()
    now = scheduler_samples("generate", "lm-small")
    assert now["running"] == 1 and now["waiting"] == 0 and now["cache"] > before["cache"]
    assert now["calls"] == before["calls"] + 2       # the prompt, then the first new token: one row each
    assert now["rows"] == before["rows"] + 2
    over, _ = run_generation(s, {})
    assert over["g"].tokens == [8]
    end = scheduler_samples("generate", "lm-small")
    assert end["running"] == 0 and end["waiting"] == 0 and end["cache"] == before["cache"]
    assert end["calls"] == before["calls"] + 1 + 9     # the prompt, then a step per token (max_length 9, eos in)


def test_a_request_admitted_while_others_run_joins_at_the_next_step_and_streams_from_there():
    lm = EchoLM()
    s = GenerationScheduler({"lm": lm}, CancelBoard())
    s.admit({"long": gen_job("abcdefgh", "long")})
    s.step()
    s.step()
    assert s.wants_new_requests()                 # no budget: room for any request
    s.admit({"short": gen_job("xy"[:1] + "w", "short")})
    s.step()                                      # its first token comes out of this step, beside long's third
    progress = {key: job for key, job, _ in s.take_progress()}
    assert progress["short"].texts == ["x"] and progress["long"].texts == ["abc"]
    over, _ = run_generation(s, {})
    assert over["short"].texts == ["xw"] and over["long"].texts == ["abcdefgh"]
    assert lm.rows_per_step == [1, 1, 2, 2, 2, 1, 1, 1, 1]


def test_a_request_waits_for_room_in_the_budget_first_come_first_served():
    lm = EchoLM()
    cost = GenJob.cost.fget(gen_job("abcd", "x"))                  # (4 + 32) x 1
    s = GenerationScheduler({"lm": lm}, CancelBoard(), budget=2 * cost)
    s.admit({"a": gen_job("abcd", "a"), "b": gen_job("abcd", "b"), "c": gen_job("ab", "c")})
    s.step()
    assert set(s.running) == {"a", "b"} and s.waiting == ["c"] and not s.wants_new_requests()
    assert s.used == 2 * cost and lm.rows_per_step == [2]
    over, held = run_generation(s, {})
    assert [over[k].texts for k in "abc"] == [["abcd"], ["abcd"], ["ab"]]
    assert lm.rows_per_step == [2, 2, 2, 2, 2, 1, 1, 1]     # c joins the step after a and b end
    assert s.used == 0 and s.wants_new_requests()


def test_a_request_over_the_budget_still_runs_alone():
    s = GenerationScheduler({"lm": EchoLM()}, CancelBoard(), budget=1)
    over, _ = run_generation(s, {"big": gen_job("abc", "big"), "next": gen_job("de", "next")})
    assert over["big"].texts == ["abc"] and over["next"].texts == ["de"]


def test_a_waiting_request_whose_client_went_away_never_joins():
    board, lm = CancelBoard(), EchoLM()
    s = GenerationScheduler({"lm": lm}, board, budget=GenJob.cost.fget(gen_job("abcd", "x")))
    s.admit({"a": gen_job("abcd", "a"), "gone": gen_job("abcd", "gone", number=9)})
    s.step()
    board.cancel(9)
    over, _ = run_generation(s, {})
    assert over["gone"].finish == ["cancelled"] and over["gone"].texts == [""] and over["a"].texts == ["abcd"]
    assert lm.rows_per_step == [1, 1, 1, 1, 1] and not s.waiting


def test_an_empty_batch_is_closed_and_abandon_closes_the_running_ones():
    s = GenerationScheduler({"lm": EchoLM()}, CancelBoard())
    run_generation(s, {"a": gen_job("ab", "a")})
    assert s.batches == {}
    s.admit({"b": gen_job("abcdef", "b")})
    s.step()
    batch = s.batches["lm"]
    s.abandon()
    assert batch.closed and not s.busy and s.batches == {} and s.used == 0
