"""``codetool.prm.client.HTTPScorer``: a ``/score`` reply that is not one finite score per item sent
is the server's fault (issue 37): retried like a body that does not parse, then ``ServerFailure``
(the machine's failure, ``codetool.rewards.machine_failure``), never a ``ValueError`` that ended the
episode as the query's own error."""

from __future__ import annotations

import pytest

from codetool.models.remote import ServerFailure
from codetool.prm.client import HTTPScorer
from codetool.rewards import PRMItem, machine_failure
from tests.test_models_faults import TIMEOUT_S, FaultyServer

ITEM = PRMItem(query="q", tools="t", history=[], candidate="x = 1", candidate_output="1")


def _server(bad_replies: int, bad):
    """A stub server whose first ``bad_replies`` ``/score`` answers are ``bad(n_items)``."""
    server = FaultyServer({})
    answered = []

    def reply(path, body):
        answered.append(path)
        n = len(body["items"])
        return bad(n) if len(answered) <= bad_replies else {"scores": [0.25] * n}

    server.reply = reply
    return server


@pytest.mark.parametrize("bad", [lambda n: {"scores": [0.5] * (n - 1)}, lambda n: {"scores": [0.5] * (n + 1)},
                                 lambda n: {"scores": ["high"] * n}, lambda n: {"scores": [None] * n},
                                 lambda n: {"scores": [True] * n}, lambda n: {"score": 0.5}],
                         ids=["fewer", "more", "text", "null", "bool", "no_scores"])
def test_a_reply_that_does_not_fit_the_items_is_retried_as_a_bad_body(bad):
    server = _server(1, bad)
    try:
        scorer = HTTPScorer(server.url, retries=3, backoff_s=0.0, timeout_s=TIMEOUT_S)
        assert scorer.score([ITEM, ITEM, ITEM]) == [0.25, 0.25, 0.25]
        assert scorer.stats()["faults"]["bad_body"] == 1 and scorer.stats()["retries"] == 1
    finally:
        server.close()


def test_a_server_that_keeps_answering_the_wrong_length_is_the_machines_failure():
    server = _server(99, lambda n: {"scores": [0.5] * (n - 1)})
    try:
        scorer = HTTPScorer(server.url, retries=2, backoff_s=0.0, timeout_s=TIMEOUT_S)
        with pytest.raises(ServerFailure, match="does not fit the request.*2 finite numbers.*after 3 attempts") as e:
            scorer.score([ITEM, ITEM])
        assert machine_failure(e.value)
    finally:
        server.close()
