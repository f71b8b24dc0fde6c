"""Calls that used to end the process (issues #27, #48): each runs in a child process, which must exit normally
with the named Python exception, never a signal. The cases crashed before: an abort from a C++ exception
(invalid code point, a grammar that accepts no token, an output index past the last), a stack overflow (a
grammar nested 20k deep), a use-after-free (two threads, close() from another thread; a handle reached through a
closed Llama), a thread count past ggml's arrays (SIGSEGV at the first decode). Or they ran away: a grammar whose
repetition bounds are reversed (48 s and 9.9 GB in llama.cpp's parser), huge or nested (the matcher's stacks), here
under a 3 GB address-space limit; eight threads streaming one greedy request got eight texts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PRE = """
import resource, sys, threading, time
import numpy as np
from pyllama_moe import Llama, LlamaGrammar
from pyllama_moe.errors import ClosedError, LlamaError
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
    # issue #72: what llama.cpp would read first in a state is checked before it reads it: a length of 0xFFFFFFFF made
    # it allocate 4 GiB (7.9 s) before it found the buffer too short; each broken field is named, in milliseconds
    "load_state_broken_header": textwrap.dedent("""
        import copy, struct
        llm.eval(llm.tokenize(b'hello world, a state to break'))
        st = llm.save_state()
        d, head = st.llama_state, 4 + struct.unpack_from('<I', st.llama_state)[0]
        def broken(data):
            b = copy.copy(st)
            b.llama_state, b.llama_state_size = data, len(data)
            return b
        cases = [(b'\\xff' * 64 + d[64:], 'architecture'),
                 (d[:head] + struct.pack('<I', 7) + d[head + 4:], 'n_stream'),
                 (d[:head + 4] + struct.pack('<I', 10**6) + d[head + 8:], 'cell_count'),
                 (d + bytes(10**7), 'more than any state'),
                 (d[:head + 2], 'header')]
        for data, match in cases:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t0 = time.monotonic()
            expect(ValueError, lambda: llm.load_state(broken(data)), match)
            assert time.monotonic() - t0 < 2, (match, time.monotonic() - t0)
            assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200 << 10, match  # KiB
        # past the checks, llama.cpp's own reason, not "copied 0 bytes"; the session then holds no tokens
        expect(LlamaError, lambda: llm.load_state(broken(d[:len(d) // 2])), 'error loading state')
        assert llm.n_tokens == 0
        expect(LlamaError, lambda: llm.load_state(broken(d + bytes(8))), '8 bytes past the end')
        llm.load_state(st)
        assert llm('hi', max_tokens=2)['usage']['completion_tokens'] <= 2
    """),
    # issue #72: an n_ctx whose KV cache cannot fit memory is refused before llama.cpp allocates (n_ctx=10**9 took
    # 6.7 s and 4 GB to end in std::bad_alloc); 2**32 - 256 cells of this model are more than 1 TB
    "n_ctx_past_memory": textwrap.dedent("""
        from pyllama_moe.errors import ContextError
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.monotonic()
        for exc in (ValueError, ContextError):
            expect(exc, lambda: Llama(sys.argv[1], n_ctx=2**32 - 256, verbose=False), 'n_ctx=4294967040 needs')
        assert time.monotonic() - t0 < 4, time.monotonic() - t0
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200 << 10  # KiB
    """),
    # issue #72: a prompt whose byte length shows it cannot fit (at least n_bytes / the longest piece tokens) is
    # refused before it is tokenized (10 MB took 9.7 s)
    "prompt_too_long_to_tokenize": textwrap.dedent("""
        from pyllama_moe.errors import ContextLengthError
        t0 = time.monotonic()
        expect(ContextLengthError, lambda: llm('hello world ' * 900_000, max_tokens=2), 'at least')
        assert time.monotonic() - t0 < 2, time.monotonic() - t0
        expect(ContextLengthError, lambda: llm('word ' * 300, max_tokens=2), 'Requested tokens (3')  # tokenized
        assert llm('word ' * 40, max_tokens=2)['usage']['completion_tokens'] <= 2
    """),
    # issue #72: a wrong type or value names the argument, what it got and what it takes (cffi's or Python's own
    # message named nothing)
    "arguments_named": textwrap.dedent("""
        for exc, fn, match in [
                (TypeError, lambda: llm.tokenize(bytearray(b'x')), 'text must be bytes (llama-cpp-python\\'s API), '
                                                                    'got bytearray'),
                (TypeError, lambda: llm.tokenize(None), 'text must be bytes'),
                (ValueError, lambda: llm('hi', max_tokens='5'), "max_tokens must be an integer or None, got '5'"),
                (ValueError, lambda: llm('hi', max_tokens=float('nan')), 'max_tokens must be an integer or None, '
                                                                         'got nan'),
                (ValueError, lambda: llm('hi', max_tokens=2, stop=123), 'stop must be a string or a list of strings, '
                                                                        'got 123'),
                (ValueError, lambda: llm('hi', max_tokens=2, logit_bias={1: 'x'}), "logit_bias[1] must be a finite "
                                                                                   "number, got 'x'"),
                (ValueError, lambda: Llama(sys.argv[1], numa='x', verbose=False), "numa must be True, False or"),
                (ValueError, lambda: Llama(sys.argv[1], rpc_servers=5, verbose=False), 'rpc_servers must be a'),
        ]:
            expect(exc, fn, match)
        assert llm('hi', max_tokens=2.0, stop=['x'], logit_bias={1: float('-inf')})['usage']['completion_tokens'] <= 2
    """),
    # issue #72: values llama-cpp-python accepts and llama.cpp ignores (or clamps) are kept, with one warning each
    "ignored_values_warned": textwrap.dedent("""
        import warnings
        def warned(fn, match):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter('always')
                fn()
            got = [str(x.message) for x in w if issubclass(x.category, UserWarning)]
            assert any(match in m for m in got), (match, got)
            print('RAISED warning', [m for m in got if match in m][0][:150])
        warned(lambda: Llama(sys.argv[1], n_ctx=64, verbose=False, override_tensor='no_such_tensor=CPU').close(),
               "override_tensor: the pattern 'no_such_tensor' matches no tensor")
        warned(lambda: Llama(sys.argv[1], n_ctx=64, verbose=False,
                             kv_overrides={'qwen3moe.context_length': 'abc'}).close(),
               "kv_overrides['qwen3moe.context_length']: 'abc' is of type str")
        for kw in ({'top_p': 1.5}, {'min_p': -0.5}, {'typical_p': 2.0}, {'mirostat_mode': 2, 'mirostat_tau': -1.0}):
            name = 'mirostat_tau' if 'mirostat_tau' in kw else next(iter(kw))
            warned(lambda: llm('hi', max_tokens=2, **kw), f'{name}={kw[name]} is outside')
        with warnings.catch_warnings(record=True) as w:  # once: a loop is not flooded
            warnings.simplefilter('always')
            llm('hi', max_tokens=2, top_p=1.5)
        assert not w, [str(x.message) for x in w]
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
    # a stream holds the Llama from its first step to its end: calls of other threads wait for it, so eight threads
    # streaming one greedy request get the lone request's text (their steps interleaved on one context before)
    "eight_threads_streaming": textwrap.dedent("""
        lone = llm('hello there', max_tokens=24, temperature=0)['choices'][0]['text']
        out, toks = [], []
        def stream():
            out.append(''.join(c['choices'][0]['text'] for c in llm('hello there', max_tokens=24, temperature=0,
                                                                     stream=True)))
        def generate():
            got = []
            for t in llm.generate(llm.tokenize(b'hello there'), temp=0):
                got.append(t)
                if len(got) == 12:
                    break
            toks.append(tuple(got))
        for target in (stream, generate):
            ts = [threading.Thread(target=target) for _ in range(8)]
            [t.start() for t in ts]
            [t.join() for t in ts]
        assert len(out) == 8 and set(out) == {lone}, set(out)
        assert len(toks) == 8 and len(set(toks)) == 1, set(toks)
        print("RAISED none: eight streams, one text")
    """),
    # a call of the stream's own thread that moves the context between two steps: the stream says so
    "same_thread_call_under_a_stream": textwrap.dedent("""
        a = llm('hello', max_tokens=20, temperature=0, stream=True)
        next(a)
        llm.tokenize(b'reading is fine')
        llm('another prompt', max_tokens=2)
        expect(LlamaError, lambda: next(a), 'interrupted')
        b = llm('hello', max_tokens=20, temperature=0, stream=True)
        next(b)
        del b  # dropped: the Llama is free again, for every thread
        t = threading.Thread(target=lambda: llm('x', max_tokens=1))
        t.start()
        t.join(30)
        assert not t.is_alive()
    """),
    # a call waiting for another thread's stream is woken by close() and raises ClosedError
    "close_while_a_call_waits_for_a_stream": textwrap.dedent("""
        s = llm('hello', max_tokens=50, stream=True)
        next(s)
        got = []
        def call():
            try:
                llm('x', max_tokens=1)
            except ClosedError as e:
                got.append(e)
        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.5)
        assert t.is_alive()  # waiting for the stream
        llm.close()
        t.join(30)
        assert not t.is_alive() and got, got
        print("RAISED ClosedError in the waiting thread")
    """),
    # ggml's per-thread arrays end at GGML_MAX_N_THREADS (512): more ended the process at the first decode
    "threads_past_the_machine": textwrap.dedent("""
        from pyllama_moe.params import max_threads
        for kw in ({"n_threads": 100000}, {"n_threads_batch": 100000}, {"n_threads": max_threads() + 1}):
            expect(ValueError, lambda: Llama(sys.argv[1], n_ctx=64, verbose=False, **kw)('hi', max_tokens=2),
                   list(kw)[0])
        expect(ValueError, lambda: llm._ctx.set_n_threads(100000, 1), 'n_threads')
        with Llama(sys.argv[1], n_ctx=64, verbose=False, n_threads=max_threads()) as ok:
            assert ok('hi', max_tokens=2)['usage']['completion_tokens'] <= 2
    """),
    # every handle of a closed Llama (and a closed sampler) raises ClosedError from each public method; its
    # pointer used to stay, freed, behind llm._vocab.piece(1)
    "use_after_close": textwrap.dedent('''
        import inspect
        from pyllama_moe.sampler import Sampler, SamplingParams
        sampler = Sampler(llm._vocab, SamplingParams(temperature=0.8))
        handles = {"vocab": llm._vocab, "model": llm._model, "context": llm._ctx, "batch": llm._batch,
                   "sampler": sampler}
        ARGS = {"token": 1, "tokens": [1, 2], "text": b"hi", "special": False, "add_special": True,
                "parse_special": False, "ids": [1], "i": 0, "idx": -1, "n": 1, "seq_id": 0, "src": 0, "dst": 1,
                "p0": 0, "p1": -1, "delta": 1, "data": b"x", "path": "/nonexistent/state", "capacity": 4,
                "fn": None, "n_threads": 1, "n_threads_batch": 1, "batch": llm._batch, "ctx": llm._ctx,
                "logits": np.zeros(llm.n_vocab(), np.float32), "pos0": 0, "all_logits": False,
                "last_logits": True, "pos": 0, "name": None, "n_layer": 1, "n_expert": 1,
                "weights": np.zeros((1, 1), np.float32), "n_bytes": 10, "type_k": 1, "type_v": 1}
        KEEP = {"close", "closed", "ctx"}  # what works closed: close again, ask whether closed, the bare pointer
        llm.close()
        sampler.close()
        expect(ClosedError, lambda: handles["vocab"].piece(1), "closed")
        checked = 0
        for what, h in handles.items():
            for name, attr in inspect.getmembers(type(h)):
                if name.startswith("_") or name in KEEP:
                    continue
                if isinstance(attr, property):
                    call = lambda: getattr(h, name)
                elif callable(attr):
                    params = inspect.signature(getattr(h, name)).parameters.values()
                    kw = {p.name: ARGS[p.name] for p in params if p.default is inspect.Parameter.empty}
                    call = lambda: getattr(h, name)(**kw)
                else:
                    continue
                expect(ClosedError, call, "closed")
                checked += 1
        assert checked >= 60, checked
        print("RAISED ClosedError from", checked, "methods")
    '''),
    # llama.cpp takes {3,1} for 2**64 - 2 optional copies (48 s, 9.9 GB before it gives up), {0,100000} for an
    # unbounded count, and nested repetitions explode its matcher's stacks: refused first, each in a millisecond
    "grammar_repetition_runaway": textwrap.dedent("""
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails here, it cannot swap
        for g in ['root ::= "a"{3,1}', 'root ::= "a"{0,100000}', 'root ::= ("a"{0,2000}){0,2000}',
                  'r ::= "a"{0,300}\\nroot ::= "x" r{0,300} "y"', 'root ::= "a"{' + '9' * 40 + '}']:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t0 = time.monotonic()
            expect(ValueError, lambda: llm('hi', max_tokens=4, grammar=g), "grammar: rule 'root'")
            expect(ValueError, lambda: llm('hi', max_tokens=4, grammar=LlamaGrammar.from_string(g)), "rule")
            assert time.monotonic() - t0 < 1, (g, time.monotonic() - t0)
            assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 100 << 10, g  # KiB
        # the same bounds on JSON schemas: a reversed pair, a bound past the limit
        for schema, match in (({"type": "array", "minItems": 3, "maxItems": 1}, "minItems"),
                              ({"type": "string", "maxLength": 10**6}, "maxLength")):
            expect(ValueError, lambda: llm.create_chat_completion([{"role": "user", "content": "x"}], max_tokens=2,
                   response_format={"type": "json_object", "schema": schema}), match)
        assert llm('hi', max_tokens=2)['usage']['completion_tokens'] <= 2
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
