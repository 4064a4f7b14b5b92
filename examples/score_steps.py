"""Score the candidate steps of your own agent with a PRM served by `codetool serve-prm`.

    codetool serve-prm --prm runs/quickstart/train/prm --port 8600    # in another shell (`make demo`'s PRM)
    python examples/score_steps.py http://127.0.0.1:8600
"""
import sys

import httpx

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8600"
tools = 'def get_books_for_library(q: str, available: bool | None = None) -> dict:\n    """Search the catalogue."""'
history = [{"code": "print(get_books_for_library(q='Le Guin'))", "output": "{'results': [{'book_id': 17}]}"}]
candidates = ["print(get_books_book_id_for_library(book_id=17))", "finish('No book by Le Guin.')"]
items = [{"query": "Is a book by Ursula K. Le Guin on the shelf?", "tools": tools, "history": history,
          "candidate": code} for code in candidates]
response = httpx.post(f"{url}/score", json={"items": items}, timeout=120)
response.raise_for_status()  # a 4xx body says what to fix: {"error": "..."}
for code, score in zip(candidates, response.json()["scores"]):
    print(f"{score:.3f}  {code}")
