"""``python -m pyllama_moe loadtest URL``: concurrent streaming clients against an OpenAI-compatible server.

Over the public HTTP API only (``http.client``, server-sent events read by hand), for each number of clients:
every client sends ``--requests`` streamed completions one after the other; printed are the aggregate tokens/s
(tokens of all requests over the wall time of the level), the time to the first token (p50, p90) and each
request's tokens/s after its first token (p50, mean). A token is a streamed chunk with text (the server sends one
per token, except where a token ends inside a character). docs/bench.md has the manual.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Sample:
    """One request: when it started, got its first token and ended, and its tokens."""

    start: float
    first: float | None
    end: float
    tokens: int
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def tokens_per_second(self) -> float | None:
        if self.first is None or self.tokens < 2 or self.end <= self.first:
            return None
        return (self.tokens - 1) / (self.end - self.first)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def stream_once(url: str, body: dict[str, Any], timeout: float, headers: dict[str, str]) -> Sample:
    """One streamed completion: its times and tokens (or its error)."""
    parts = urlsplit(url)
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    path = parts.path.rstrip("/") + ("/v1/chat/completions" if "messages" in body else "/v1/completions")
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    try:
        conn.request("POST", path, json.dumps({**body, "stream": True}),
                     {"content-type": "application/json", **headers})
        resp = conn.getresponse()
        if resp.status != 200:
            return Sample(start, None, time.perf_counter(), 0, f"HTTP {resp.status}: {resp.read()[:200]!r}")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: "):]
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return Sample(start, first, time.perf_counter(), tokens, str(chunk["error"].get("message")))
            choice = chunk["choices"][0]
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if text:
                tokens += 1
                if first is None:
                    first = time.perf_counter()
        return Sample(start, first, time.perf_counter(), tokens)
    except (OSError, http.client.HTTPException, ValueError) as e:
        return Sample(start, first, time.perf_counter(), tokens, f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def run_level(url: str, clients: int, requests: int, body_of: Any, timeout: float,
              headers: dict[str, str]) -> dict[str, Any]:
    """``clients`` threads, each sending ``requests`` streams in turn: the level's figures and its samples."""
    samples: list[Sample] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for r in range(requests):
            s = stream_once(url, body_of(c, r), timeout, headers)
            with lock:
                samples.append(s)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [s for s in samples if s.error is None]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    tps = [s.tokens_per_second for s in ok if s.tokens_per_second is not None]
    total = sum(s.tokens for s in ok)
    return {
        "clients": clients, "requests": len(samples), "errors": len(samples) - len(ok),
        "first_error": next((s.error for s in samples if s.error), None),
        "wall_s": wall, "tokens": total, "aggregate_tps": total / wall if wall > 0 else 0.0,
        "ttft_p50_s": _percentile(ttft, 0.5), "ttft_p90_s": _percentile(ttft, 0.9),
        "request_tps_p50": _percentile(tps, 0.5), "request_tps_mean": statistics.fmean(tps) if tps else None,
        "samples": [asdict(s) for s in samples],
    }


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyllama_moe loadtest",
                                 description="concurrent streaming clients against an OpenAI-compatible server")
    ap.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--clients", default="1,4,16", help="numbers of concurrent clients, comma-separated (1,4,16)")
    ap.add_argument("--requests", type=int, default=4, help="streamed requests per client at each level (4)")
    ap.add_argument("--max-tokens", type=int, default=128, help="max_tokens of each request (128)")
    ap.add_argument("--prompt", default="Write a long story about a lighthouse keeper. Chapter",
                    help="the prompt; each request appends its client and request number")
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--model", default=None, help="the model to name in the requests")
    ap.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request (600)")
    ap.add_argument("--json", dest="json_path", default=None, help="write the figures and samples to this file")
    ap.add_argument("--no-warm", dest="warm", action="store_false",
                    help="time each level from a cold start: by default a round of short requests at the level's "
                         "concurrency runs first, untimed (a server's first steps with a new number of sequences "
                         "build their CUDA graphs and pick their kernels: 0.15 s on an H100)")
    args = ap.parse_args(argv)
    try:
        levels = [int(x) for x in args.clients.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--clients must be numbers separated by commas, got {args.clients!r}")
    if not levels or min(levels) < 1 or args.requests < 1 or args.max_tokens < 1:
        ap.error("--clients, --requests and --max-tokens must be at least 1")
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    def body_of(c: int, r: int) -> dict[str, Any]:
        text = f"{args.prompt} {c}.{r}:"
        body: dict[str, Any] = {"max_tokens": args.max_tokens, "temperature": args.temperature}
        if args.model:
            body["model"] = args.model
        if args.chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        return body

    warm = stream_once(args.url, body_of(0, 0) | {"max_tokens": 4}, args.timeout, headers)
    if warm.error is not None:
        print(f"loadtest: error: the warm-up request failed: {warm.error}", file=sys.stderr)
        return 1
    results = []
    print(f"{'clients':>7} {'requests':>8} {'errors':>6} {'tokens':>7} {'agg t/s':>9} {'TTFT p50':>9} "
          f"{'TTFT p90':>9} {'req t/s p50':>11} {'req t/s mean':>12}")
    for n in levels:
        if args.warm and n > 1:
            run_level(args.url, n, 1, lambda c, r: body_of(c, r) | {"max_tokens": min(4, args.max_tokens)},
                      args.timeout, headers)
        res = run_level(args.url, n, args.requests, body_of, args.timeout, headers)
        results.append(res)
        print(f"{n:>7} {res['requests']:>8} {res['errors']:>6} {res['tokens']:>7} {_fmt(res['aggregate_tps']):>9} "
              f"{_fmt(res['ttft_p50_s'], 3):>9} {_fmt(res['ttft_p90_s'], 3):>9} "
              f"{_fmt(res['request_tps_p50']):>11} {_fmt(res['request_tps_mean']):>12}", flush=True)
        if res["first_error"]:
            print(f"        first error: {res['first_error']}", file=sys.stderr)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"url": args.url, "max_tokens": args.max_tokens, "requests_per_client": args.requests,
                       "chat": args.chat, "levels": results}, f, indent=1)
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
