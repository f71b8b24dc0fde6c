"""Calls that used to end the process (issue #27): each runs in a child process, which must exit normally
with the named Python exception, never a signal. The cases crashed before: an abort from a C++ exception
(invalid code point, a grammar that accepts no token, an output index past the last), a stack overflow (a
grammar nested 20k deep), a use-after-free (two threads, close() from another thread)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PRE = """
import sys, threading, time
import numpy as np
from pyllama_moe import Llama, LlamaGrammar
from pyllama_moe.errors import ClosedError
llm = Llama(sys.argv[1], n_ctx=256, verbose=False)
def expect(exc, fn, match=""):
    try:
        fn()
    except exc as e:
        assert match in str(e), (match, str(e))
        print("RAISED", type(e).__name__, str(e).splitlines()[0][:200])
    else:
        raise AssertionError(f"no {exc.__name__}")
"""

CASES = {
    # llama_tokenize throws on bytes that are no code point (F4 90 80 80: U+110000)
    "tokenize_invalid_code_point": "expect(ValueError, lambda: llm.tokenize(b'\\xf4\\x90\\x80\\x80abc'), 'tokenize')",
    # parses, but no token can ever match: rejected before llama.cpp sees it
    "grammar_empty_range": "expect(ValueError, lambda: llm('hi', max_tokens=4, grammar=LlamaGrammar.from_string("
                           "'root ::= [z-a]')), 'empty')",
    # the recursive parser would overflow the stack
    "grammar_nested_deep": "g = LlamaGrammar.from_string('root ::= ' + '(' * 20000 + '\"a\"' + ')' * 20000)\n"
                           "expect(ValueError, lambda: llm('hi', max_tokens=2, grammar=g), 'nested')",
    # past the check before llama.cpp: the chain finds no token the grammar accepts and llama.cpp throws; the
    # exception becomes a ValueError (greedy, sampled, and through a logits processor), the Llama stays usable
    "grammar_no_token": textwrap.dedent("""
        from pyllama_moe import sampler
        sampler.check_grammar = lambda text: None
        for kw in ({"temperature": 0}, {"temperature": 0.8}, {"logits_processor": [lambda ids, s: s]}):
            expect(ValueError, lambda: llm('hi', max_tokens=2, grammar='root ::= [z-a]', **kw), 'no token')
        assert llm('hi', max_tokens=2)['usage']['completion_tokens'] == 2
    """),
    "sample_idx_out_of_range": "llm.eval(llm.tokenize(b'hello world'))\n"
                               "expect(ValueError, lambda: llm.sample(idx=10**6), 'idx')\n"
                               "expect(ValueError, lambda: llm.sample(idx=0), 'idx')  # no logits there",
    "token_id_past_32_bits": "expect(ValueError, lambda: llm.eval([2**32 + 5]), 'vocabulary')",
    "token_id_negative": "expect(ValueError, lambda: llm.eval([-1]), 'vocabulary')",
    "logits_processor_none": "expect(ValueError, lambda: llm('hi', max_tokens=3, "
                             "logits_processor=[lambda ids, s: None]), 'logits_processor')",
    "logits_processor_nan": "expect(ValueError, lambda: llm('hi', max_tokens=3, "
                            "logits_processor=[lambda ids, s: np.full_like(s, np.nan)]), 'NaN')",
    # an empty state read nothing and was accepted; a state that is not one is a TypeError naming it
    "load_state_empty": textwrap.dedent("""
        import copy
        st = llm.save_state()
        empty = copy.copy(st)
        empty.llama_state, empty.llama_state_size = b"", 0
        expect(ValueError, lambda: llm.load_state(empty), 'empty')
        cut = copy.copy(st)
        cut.n_tokens = 10**6
        expect(ValueError, lambda: llm.load_state(cut), 'n_tokens')
        expect(TypeError, lambda: llm.load_state(None), 'LlamaState')
        llm.load_state(st)
    """),
    # calls from several threads are serialized: each gets its own whole result
    "four_threads": textwrap.dedent("""
        out = []
        ts = [threading.Thread(target=lambda: out.append(llm('hello there', max_tokens=16, temperature=0)))
              for _ in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        texts = {o['choices'][0]['text'] for o in out}
        assert len(out) == 4 and len(texts) == 1, texts
        print("RAISED none: four ordered calls")
    """),
    # close() from another thread waits for the step in progress; the stream then raises ClosedError
    "close_during_a_stream": textwrap.dedent("""
        got = []
        def consume():
            try:
                for chunk in llm('hello', max_tokens=200, stream=True):
                    got.append(chunk)
            except ClosedError as e:
                got.append(e)
        t = threading.Thread(target=consume)
        t.start()
        while not got:
            time.sleep(0.001)
        llm.close()
        t.join()
        assert isinstance(got[-1], ClosedError), got[-1]
        print("RAISED ClosedError after", len(got) - 1, "chunks")
    """),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_crash(path: Path, case: str) -> None:
    res = subprocess.run([sys.executable, "-c", PRE + CASES[case], str(path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert "RAISED" in res.stdout, res.stdout
