"""The bench harness: tool output parsing, the table, and a real run of the native tools on the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pyllama_moe.moe import MoeCacheStats
from pyllama_moe.tools import bench

BATCHED_OUT = """
llama_moe_cache: ubatch <= 8: hits = 182, misses = 16, hit rate = 91.92%, uploaded = 0.05 MiB
llama_moe_cache: ubatch  > 8: hits = 10, misses = 5, hit rate = 66.67%, uploaded = 1.50 MiB
llama_moe_cache: device lookups: hits = 900, misses = 100, hit rate = 90.00%, uploaded = 12.50 MiB
llama_moe_cache: prefetch of large batches: 144.0 copy calls, 2930.5 regions, 12000.25 MiB from the cache, 3552.00 MiB uploaded per ubatch (2 ubatches)
{"n_kv_max": 2208, "n_batch": 2048, "n_ubatch": 2048, "flash_attn": 1, "is_pp_shared": 0, "n_gpu_layers": 99, "n_threads": 16, "n_threads_batch": 16, "pp": 2048, "tg": 128, "pl": 1, "n_kv": 2176, "t_pp": 0.679, "speed_pp": 3015.2, "t_tg": 0.838, "speed_tg": 152.8, "t": 1.5, "speed": 1450.0}
"""  # noqa: E501  (llama-batched-bench's output, its lines as the tool prints them)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("bench") / "tiny.gguf", "tiny", seed=3)


def test_parse_cache_stats_and_jsonl() -> None:
    stats = bench.parse_cache_stats(BATCHED_OUT)
    assert stats["ubatch <= 8"] == {"hits": 182, "misses": 16, "hit_rate": 91.92, "uploaded_mib": 0.05}
    assert stats["ubatch > 8"]["uploaded_mib"] == 1.5
    assert stats["device lookups"] == {"hits": 900, "misses": 100, "hit_rate": 90.0, "uploaded_mib": 12.5}
    assert stats["prompt copies"] == {"calls": 144.0, "regions": 2930.5, "cache": 12000.25, "host": 3552.0}
    row = bench.Row("cache-80", {}, "python", 2048, 2048, 0, 4000.0, cache=stats)
    assert bench.table([row]).splitlines()[-1].endswith(
        "| 90.0% hits, 12 MiB up | - | 144 calls, 12000 MiB cached, 3552 MiB up |")
    rows = bench.parse_jsonl(BATCHED_OUT + "\n{broken\n")
    assert len(rows) == 1 and rows[0]["speed_tg"] == 152.8


def test_expert_bytes_match_the_writer(tiny: Path) -> None:
    from pyllama_moe.gguf_info import GGUFInfo
    from pyllama_moe.tools import synth

    assert GGUFInfo.read(tiny).expert_bytes == synth.plan("tiny").expert_bytes > 0
    with pytest.raises(ValueError, match="not a readable GGUF"):
        GGUFInfo.read(Path(__file__))


def test_cache_setup_runs_batched_bench_with_its_share(tiny: Path) -> None:
    from pyllama_moe.tools import synth

    seen: list[tuple[list[str], dict[str, str]]] = []

    def fake(cmd: list[str], env: dict[str, str]) -> str:
        seen.append((cmd, env))
        return BATCHED_OUT

    rows = bench.measure(tiny, bench.SETUPS["cache-80"], {"GGML_SCHED_PREFETCH": "0"}, [2048], [512, 2048], 128, 1,
                         run=fake)
    assert len(seen) == 2  # one run per (prompt, ubatch)
    cmd, env = seen[0]
    assert Path(cmd[0]).name == "llama-batched-bench" and "--cpu-moe" in cmd
    mib = int(cmd[cmd.index("--moe-cache-mib") + 1])
    assert mib == max(1, int(synth.plan("tiny").expert_bytes * 0.8) >> 20)
    assert env == {"GGML_SCHED_PREFETCH": "0"}
    assert [(r.n_prompt, r.n_gen, r.tokens_per_s) for r in rows[:2]] == [(2048, 0, 3015.2), (0, 128, 152.8)]
    assert rows[0].cache["ubatch <= 8"]["hit_rate"] == 91.92


def test_batched_bench_shows_the_log_of_the_end_of_the_run(tiny: Path) -> None:
    # the cache statistics are logged at llama's info level when the context is freed: the verbosity the bench
    # gives llama-batched-bench must show such lines (here the performance summary printed just before)
    seen: list[list[str]] = []
    bench.measure(tiny, bench.setup_named("cache-1mib"), {}, [64], [64], 4, 1,
                  run=lambda cmd, env: seen.append(cmd) or BATCHED_OUT)
    cmd = seen[0]
    cmd[cmd.index("--moe-cache-mib") + 1] = "0"  # without a GPU: the same run without the cache
    out = bench.run_tool(cmd, {})
    assert "llama_perf_context_print" in out and '"speed_tg"' in out, out[-2000:]


def test_real_run_and_table(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = bench.main([str(tiny), "--setups", "cpu_moe-mmap,cpu_moe-none", "--pp", "64", "--ub", "32,64",
                     "--tg", "4", "--reps", "1", "--switch", "LLAMA_EXAMPLE_SWITCH", "--switch", "LLAMA_OPT_IN=1",
                     "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "MISMATCH" not in text
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header, rule, *body = lines
    assert header == ("| setup | switches | via | pp64 ub32 | pp64 ub64 | tg4 | cache (decode) | prefetch staging "
                      "| prompt copies per ubatch |")
    assert rule.count("---") == 9
    assert [[c.strip() for c in b.split("|")[1:4]] for b in body] == [
        [s, sw, via] for s in ("cpu_moe-mmap", "cpu_moe-none")
        for sw in ("-", "LLAMA_EXAMPLE_SWITCH=0", "LLAMA_OPT_IN=1") for via in ("native", "python")]
    for b in body:
        cells = [c.strip() for c in b.split("|")[4:7]]
        if "python" in b:  # the Python API runs the longest prompt at the largest ubatch only
            assert cells[0] == "-" and float(cells[1]) > 0 and float(cells[2]) > 0, b
        else:
            assert all(float(c) > 0 for c in cells), b
    data = json.loads(out.read_text())
    assert data["mismatches"] == []
    native = [r for r in data["rows"] if r["tool"] == "llama-bench"]
    api = [r for r in data["rows"] if r["tool"] == "python"]
    assert len(native) == 6 * 3 and len(api) == 6 * 2
    # the same placement gives the same logits and greedy tokens whatever the (here inert) switch says
    for setup in ("cpu_moe-mmap", "cpu_moe-none"):
        for kind in ("n_prompt", "n_gen"):
            digests = {r["digest"] for r in api if r["setup"] == setup and r[kind]}
            assert len(digests) == 1 and all(len(d) == 16 for d in digests)


def run_cpu_moe(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], ub: str, *extra: str
                ) -> tuple[str, dict]:
    """The bench on cpu_moe-none, pp64 and tg4, with an inert switch: its table (checked free of mismatches)
    and its JSON."""
    out = tmp_path / "bench.json"
    rc = bench.main([str(tiny), "--setups", "cpu_moe-none", "--pp", "64", "--ub", ub, "--tg", "4", "--reps", "1",
                     "--switch", "LLAMA_EXAMPLE_SWITCH", *extra, "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "MISMATCH" not in text
    return text, json.loads(out.read_text())


def test_api_at_every_ubatch(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --api-every-ub: the Python prompt runs at each ubatch size, so the logits hash is compared at each;
    # --warm: a decode longer than the prompt's context first (the context is sized for it), same hashes
    text, data = run_cpu_moe(tiny, tmp_path, capsys, "64,32", "--api-every-ub", "--warm", "100")
    api = [r for r in data["rows"] if r["tool"] == "python" and r["n_prompt"]]
    assert sorted((r["n_ubatch"], r["switches"].get("LLAMA_EXAMPLE_SWITCH", "")) for r in api) == [
        (32, ""), (32, "0"), (64, ""), (64, "0")]
    for u in (32, 64):
        assert len({r["digest"] for r in api if r["n_ubatch"] == u}) == 1
    python_rows = [ln for ln in text.splitlines() if "| python |" in ln]
    assert all(float(ln.split("|")[4]) > 0 and float(ln.split("|")[5]) > 0 for ln in python_rows), python_rows


def test_tokens_after_the_prompt(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --first: greedy tokens continue the timed prompt, a column of their own with the time including the prompt;
    # their hash is compared across the switches like the others
    text, data = run_cpu_moe(tiny, tmp_path, capsys, "64", "--first", "6", "--no-native")
    header = next(ln for ln in text.splitlines() if ln.startswith("| setup"))
    cols = [c.strip() for c in header.split("|")[1:-1]]
    assert "tg6 after pp64" in cols and cols[-1] == "tokens after the prompt"
    python_rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in text.splitlines() if "| python |" in ln]
    assert len(python_rows) == 2
    for row in python_rows:
        assert float(row[cols.index("tg6 after pp64")]) > 0 and row[-1].endswith("s with the prompt"), row
    assert all(r["tool"] == "python" for r in data["rows"])  # --no-native
    rows = [r for r in data["rows"] if r["n_prompt"] and r["n_gen"]]
    assert len(rows) == 2 and len({r["digest"] for r in rows}) == 1 and rows[0]["n_gen"] == 6
    assert rows[0]["cache"]["first"]["s_with_prompt"] > 0


def test_generation_with_drafts(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --draft: greedy generation after a prompt that quotes code and after prose, without a draft and with prompt
    # lookup at each size, alone and under draft_adapt's rule (with --draft-bounds also the drafts all accepted and all
    # rejected, the latter under the rule too): a table of their own,
    # a row each; the accepted draft tokens are the tokens generated less the decodes. (One size, as each costs six
    # generations per switch setting; test_bench_draft.py has the comma list's)
    text, data = run_cpu_moe(tiny, tmp_path, capsys, "64", "--draft", "2", "--draft-bounds", "--no-native")
    header = next(ln for ln in text.splitlines() if ln.startswith("| setup"))
    assert "gen" not in header  # the measurements' table leaves them to the draft table
    gen = [r for r in data["rows"] if r["label"]]
    # the teacher-forced bound decodes the text generated without a draft but its last token, which the generation
    # never evaluates either
    labels = ["gen4 code", "gen4 text"] + [f"gen4 {p} draft 2 {by}" for p in ("code", "text")
                                           for by in ("lookup", "lookup-adapt", "wrong", "wrong-adapt")]
    labels += [f"gen3 {p} draft 2 forced" for p in ("code", "text")]
    assert sorted(r["label"] for r in gen) == sorted(labels * 2)  # under two switches
    for r in gen:
        g = r["cache"]["generate"]
        assert r["n_gen"] == (3 if r["label"].endswith("forced") else 4)
        assert r["tokens_per_s"] > 0 and r["n_prompt"] > 256
        assert g["accepted"] == r["n_gen"] - g["decodes"] and g["tokens_per_decode"] == r["n_gen"] / g["decodes"]
        if r["label"].endswith("wrong"):
            assert g["accepted"] == 0 and g["proposed"] > 0
        if r["label"].endswith("forced"):
            assert g["accepted"] == g["proposed"] > 0
        assert "misses" not in g  # no MoE cache on the CPU
    # the same text under both switch settings (a hash per label, compared like the others)
    assert all(len({r["digest"] for r in gen if r["label"] == label}) == 1 for label in labels)
    lines = text.split("generation with a draft")[1].splitlines()
    rows = [ln for ln in lines if ln.startswith("| cpu_moe-none")]
    assert len(rows) == len(labels) * 2 and all(ln.split("|")[-2].strip() in ("yes", "NO") for ln in rows)


def test_warmup_changes_no_result(tiny: Path) -> None:
    # --warmup: the tokens evaluated before the timed prompt (none, a few, or by default a whole ubatch) change
    # its speed only
    setup = bench.setup_named("cpu_moe-none")
    assert setup is not None
    seen = []
    for warmup in (0, 16, None):
        def run(cmd: list[str], env: dict[str, str]) -> str:
            seen.append(json.loads(cmd[-1])["warmup"])
            return bench.run_tool(cmd, env)

        kw = {} if warmup is None else {"warmup": warmup}
        rows = bench.api_measure(tiny, setup, {}, 64, 64, 4, run=run, **kw)
        seen.append(tuple(r.digest for r in rows))
    assert seen[0::2] == [0, 16, -1] and seen[1] == seen[3] == seen[5]


def test_prompt_in_batches(tiny: Path) -> None:
    # --batch: the prompt in batches of 16 tokens, as llama-server's -b, computes the ubatches of one batch of 64 with
    # ubatches of 16, so the results are the same
    setup = bench.setup_named("cpu_moe-none")
    assert setup is not None
    seen = []

    def run(cmd: list[str], env: dict[str, str]) -> str:
        seen.append(json.loads(cmd[-1])["batch"])
        return bench.run_tool(cmd, env)

    split = bench.api_measure(tiny, setup, {}, 64, 16, 4, run=run, batch=16)
    whole = bench.api_measure(tiny, setup, {}, 64, 16, 4, run=run)
    assert seen == [16, 0]
    assert [r.digest for r in split] == [r.digest for r in whole] and all(r.digest for r in split)


def test_prompt_seeds_are_the_difference() -> None:
    def stats(ubatches: int, experts: int) -> MoeCacheStats:
        return MoeCacheStats.from_dict({"seed": {"ubatches": ubatches, "experts": experts}})

    assert bench.prompt_seeds(stats(2, 10), stats(5, 70)) == {"ubatches": 3, "experts": 60}
    assert bench.prompt_seeds(stats(2, 10), stats(2, 10)) is None  # no seed in between
    assert bench.prompt_seeds(None, stats(1, 1)) is None  # no cache


def test_mismatches_are_found() -> None:
    def row(sw: dict[str, str], digest: str, n_prompt: int = 64) -> bench.Row:
        return bench.Row("gpu", sw, "python", n_prompt, 64, 0 if n_prompt else 8, 1.0, digest=digest)

    same = [row({}, "a"), row({"X": "0"}, "a"), row({}, "b", 0), row({"X": "0"}, "b", 0)]
    assert bench.mismatches(same) == []
    bad = bench.mismatches([*same[:2], row({}, "b", 0), row({"X": "0"}, "c", 0)])
    assert bad == ["MISMATCH gpu tg8: - -> b, X=0 -> c"]
    # native rows carry no hash and are never compared
    assert bench.mismatches([bench.Row("gpu", {}, "llama-bench", 64, 64, 0, 1.0)]) == []


LOG = """load_tensors:        CUDA0 model buffer size =   512.25 MiB
load_tensors:   CPU_Mapped model buffer size =  1024.00 MiB
llama_moe_cache:      CUDA0 MoE cache size =  3888.00 MiB for 15552.00 MiB of host experts
llama_moe_cache: 48 layers, q4_0:  1536 slots (25.0%)
llama_kv_cache:      CUDA0 KV buffer size =    48.00 MiB
sched_reserve:      CUDA0 compute buffer size =   300.00 MiB
sched_reserve:      CUDA0 compute buffer size =   301.50 MiB
llama_moe_cache: ubatch <= 8: hits = 90, misses = 10, hit rate = 90.00%, uploaded = 12.50 MiB
"""


def test_decisions_of_upstream_and_pristine_are_compared() -> None:
    # --upstream --pristine: the rows with every kill switch at 0 must decide what upstream's own tools decide
    d = bench.parse_decisions(LOG)
    assert d == {"CUDA0 model MiB": 512.25, "CPU_Mapped model MiB": 1024.0, "CUDA0 MoE cache MiB": 3888.0,
                 "slots of 48 q4_0 layers": 1536.0, "CUDA0 KV MiB": 48.0, "CUDA0 compute MiB": 301.5}
    theirs = bench.parse_cache_stats(LOG)
    assert theirs["decisions"] == d and theirs["ubatch <= 8"]["hits"] == 90

    def row(sw: dict[str, str], text: str) -> bench.Row:
        return bench.Row("cache-25", sw, "llama-batched-bench", 0, 512, 32, 1.0, cache=bench.parse_cache_stats(text))

    up = bench.upstream_switches()
    # our build also logs its own lines (a device lookup count): only what upstream logs is compared
    ours = LOG + "llama_moe_cache: device lookups: hits = 0, misses = 0, hit rate = 0.00%, uploaded = 0.00 MiB\n"
    assert bench.upstream_differences([row(up, ours), row(bench.PRISTINE, LOG), row({}, "")]) == []
    bigger = LOG.replace("301.50", "333.00").replace("hits = 90, misses = 10", "hits = 80, misses = 20")
    assert bench.upstream_differences([row(up, bigger), row(bench.PRISTINE, LOG)]) == [
        "DIFFERS cache-25 tg32 ubatch <= 8 hits: upstream 80 vs pristine 90",
        "DIFFERS cache-25 tg32 ubatch <= 8 misses: upstream 20 vs pristine 10",
        "DIFFERS cache-25 tg32 decisions CUDA0 compute MiB: upstream 333.0 vs pristine 301.5"]
    fewer = LOG.replace("1536 slots", "1535 slots")
    assert bench.upstream_differences([row(up, fewer), row(bench.PRISTINE, LOG)]) == [
        "DIFFERS cache-25 tg32 decisions slots of 48 q4_0 layers: upstream 1535.0 vs pristine 1536.0"]


@pytest.mark.gpu
def test_upstream_matches_a_pristine_build_on_the_gpu(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # #26: with every kill switch at 0 our build decides as upstream's own build (ci/gpu.sh pristine makes one): the
    # same buffer sizes, cache slots, hits, misses and MiB uploaded, for caches that evict and caches that do not
    import os

    build = Path(os.environ.get("PYLLAMA_MOE_PRISTINE_BUILD", "/tmp/pristine")) / "build"
    if not (build / "bin" / "llama-batched-bench").exists():
        pytest.skip(f"no pristine build in {build} (ci/gpu.sh pristine)")
    rc = bench.main([str(tiny), "--setups", "cache-25,cache-80", "--pp", "64", "--ub", "64", "--tg", "16",
                     "--reps", "1", "--upstream", "--pristine", str(build), "--no-api"])
    text = capsys.readouterr().out
    assert rc == 0 and "DIFFERS" not in text, text
    assert text.count("pristine") >= 2, text


def test_unknown_setup_is_an_error(tiny: Path) -> None:
    with pytest.raises(SystemExit):
        bench.main([str(tiny), "--setups", "nope"])


def test_token_counts_that_would_run_nothing_are_errors(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the Python API runs the ubatch sizes within the longest prompt: with --no-native and none of them, no row at all
    for pp, ub in (("32", "512"), ("32", "x"), ("0", "32")):
        with pytest.raises(SystemExit):
            bench.main([str(tiny), "--setups", "cpu_moe-none", "--pp", pp, "--ub", ub, "--no-native"])
    assert "no ubatch size within the prompt" in capsys.readouterr().err


def test_overhead_rows(tiny: Path) -> None:
    rows = bench.overhead(tiny, n=8, reps=1)
    assert [r["path"] for r in rows] == ["bare decode loop", "create_completion greedy", "create_completion typical"]
    assert all(r["tokens"] > 0 and math.isfinite(r["us_per_token"]) for r in rows)
    assert rows[0]["us_per_token"] > 0  # the API rows subtract a prompt time measured apart: noise can make them <= 0
    assert rows[0]["overhead_us"] == 0.0
    table = bench.overhead_table(rows).splitlines()
    assert len(table) == 5 and table[0].startswith("| path |")


def test_dense_setups_fill_in_the_model_half() -> None:
    import re

    ffn = bench.SETUPS["dense-ffn-half"].resolve(5)
    pattern, buft = ffn.args[ffn.args.index("-ot") + 1].rsplit("=", 1)
    assert buft == "CPU" and dict(ffn.llama_kwargs)["override_tensor"] == f"{pattern}=CPU"
    names = [f"blk.{i}.ffn_{k}.weight" for i in range(12) for k in ("up", "down", "gate")]
    assert {n for n in names if re.search(pattern, n)} == {n for n in names if n.split(".")[1] in ("2", "3", "4")}
    assert not re.search(pattern, "blk.3.attn_q.weight")
    ngl = bench.SETUPS["dense-ngl-half"].resolve(5)
    assert ngl.args[ngl.args.index("-ngl") + 1] == "2" and dict(ngl.llama_kwargs)["n_gpu_layers"] == 2


def test_dense_and_upstream_run(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pyllama_moe.tools import synth

    dense = synth.write_model(tmp_path / "dense.gguf", "tiny", arch="qwen3", seed=4, n_layer=4)
    from pyllama_moe.gguf_info import GGUFInfo

    assert GGUFInfo.read(dense).require_block_count() == 4
    rc = bench.main([str(tiny), "--dense", str(dense), "--setups", "cpu_moe-none,dense-ngl-half,dense-ffn-half",
                     "--pp", "32", "--ub", "32", "--tg", "4", "--reps", "1", "--upstream", "--no-api"])
    text = capsys.readouterr().out
    assert rc == 0, text
    body = [ln for ln in text.splitlines() if ln.startswith("|")][2:]
    assert [[c.strip() for c in b.split("|")[1:3]] for b in body] == [
        [s, sw] for s in ("cpu_moe-none", "dense-ngl-half", "dense-ffn-half") for sw in ("-", "upstream")]
    assert bench.switch_label(bench.upstream_switches()) == "upstream"
    with pytest.raises(SystemExit):
        bench.main([str(tiny), "--setups", "dense-gpu"])  # needs --dense


def test_upstream_sets_every_documented_kill_switch() -> None:
    import re

    switches = (Path(__file__).parents[2] / "docs" / "environment.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z0-9_]+)` \| .*\(upstream\)", switches, re.M))
    assert documented == set(bench.KILL_SWITCHES)
    assert bench.upstream_switches() == {k: "0" for k in documented}


def test_cache_setup_of_a_fixed_size(tiny: Path) -> None:
    setup = bench.setup_named("cache-3mib")
    assert setup is not None and setup.has_cache and bench.cache_mib(tiny, setup) == 3
    assert "--cpu-moe" in setup.batched_args and setup.name == "cache-3mib"
    assert bench.setup_named("cache-0mib") is None and bench.setup_named("cache-x") is None
    assert bench.cache_mib(tiny, bench.SETUPS["gpu"]) == 0


def test_cache_setups_with_mmap(tiny: Path) -> None:
    # <cache setup>-mmap: the same cache, the experts loaded with mmap in the native tools and the Python API
    for base in ("cache-25", "cache-3mib"):
        plain, mapped = bench.setup_named(base), bench.setup_named(base + "-mmap")
        assert plain is not None and mapped is not None and mapped.name == base + "-mmap"
        assert plain.args[plain.args.index("-lm") + 1] == "none" and mapped.args[mapped.args.index("-lm") + 1] == "mmap"
        assert dict(plain.llama_kwargs)["load_mode"] == "none" and dict(mapped.llama_kwargs)["load_mode"] == "mmap"
        assert bench.cache_mib(tiny, mapped) == bench.cache_mib(tiny, plain) > 0
        assert mapped.batched_args == plain.batched_args
    # only cache setups have it; cpu_moe-mmap is a setup of its own
    assert bench.setup_named("cpu_moe-mmap") is bench.SETUPS["cpu_moe-mmap"]
    assert bench.setup_named("gpu-mmap") is None and bench.setup_named("cpu_moe-none-mmap") is None
    assert bench.setup_named("cache-x-mmap") is None


def test_fit_setups(monkeypatch: pytest.MonkeyPatch, tiny: Path) -> None:
    # fit-<G>gib[-cache]: Python only, a fit target that leaves G GiB of the GPU, without the cache or with "auto"
    from pyllama_moe import backend

    plain, cached = bench.setup_named("fit-12gib"), bench.setup_named("fit-12gib-cache")
    assert plain is not None and cached is not None and bench.setup_named("fit-0gib") is None
    assert (plain.fit_gib, plain.cache_auto, cached.cache_auto) == (12, False, True) and plain.needs_gpu
    assert bench.measure(tiny, cached, {}, [64], [64], 4, 1, run=lambda c, e: pytest.fail("no native run")) == []
    gpu = backend.Device(1, "CUDA0", "fake", "gpu", memory_free=100 << 30, memory_total=140 << 30)
    monkeypatch.setattr(backend, "devices", lambda: [backend.Device(0, "CPU", "cpu", "cpu", 0, 0), gpu])
    assert bench.fit_kwargs(cached) == {"fit": True, "fit_target_mib": 88 << 10, "n_gpu_layers": -1,
                                        "load_mode": "none", "moe_cache_mib": "auto"}
    assert bench.fit_kwargs(plain)["moe_cache_mib"] == 0


def test_pristine_rows_run_the_tools_of_another_build(tiny: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # a build folder with llama-bench and llama-batched-bench in bin/ (here links to ours, standing in for an
    # unpatched build): its rows come after the switch settings, run with no switch set, native only
    seen: list[tuple[str, dict[str, str]]] = []
    build = tmp_path / "pristine"
    (build / "bin").mkdir(parents=True)
    for name in ("llama-bench", "llama-batched-bench"):
        (build / "bin" / name).symlink_to(bench.tool_path(name))
    assert bench.tool_path("llama-bench", build) == build / "bin" / "llama-bench"

    def run(cmd: list[str], env: dict[str, str]) -> str:
        seen.append((cmd[0], env))
        return bench.run_tool(cmd, env)

    rows = bench.measure(tiny, bench.SETUPS["cpu_moe-none"], bench.PRISTINE, [32], [32], 4, 1, run=run, tools=build)
    assert seen == [(str(build / "bin" / "llama-bench"), {})]  # no switch reaches upstream's tools
    assert [bench.switch_label(r.switches) for r in rows] == ["pristine", "pristine"]
    assert all(r.tokens_per_s > 0 for r in rows)

    rc = bench.main([str(tiny), "--setups", "cpu_moe-none", "--pp", "32", "--ub", "32", "--tg", "4", "--reps", "1",
                     "--upstream", "--pristine", str(build)])
    text = capsys.readouterr().out
    assert rc == 0, text
    body = [ln for ln in text.splitlines() if ln.startswith("|")][2:]
    assert [[c.strip() for c in b.split("|")[1:4]] for b in body] == [
        ["cpu_moe-none", "-", "native"], ["cpu_moe-none", "-", "python"], ["cpu_moe-none", "upstream", "native"],
        ["cpu_moe-none", "upstream", "python"], ["cpu_moe-none", "pristine", "native"]]
    with pytest.raises(SystemExit):
        bench.main([str(tiny), "--setups", "cpu_moe-none", "--pristine", str(tmp_path / "absent")])
    with pytest.raises(SystemExit):
        bench.main([str(tiny), "--setups", "cpu_moe-none", "--no-native", "--pristine", str(build)])


def test_prompt_copies_are_those_of_the_timed_ubatches() -> None:
    def stats(ubatches: int, calls: int, regions: int, cache_mib: float, host_mib: float) -> MoeCacheStats:
        return MoeCacheStats.from_dict({"prefetch": {"ubatches": ubatches, "calls": calls, "regions": regions,
                                                     "bytes_cache": cache_mib * 2**20, "bytes_host": host_mib * 2**20}})

    before, after = stats(3, 300, 9000, 1000.0, 40000.0), stats(5, 582, 17000, 23000.0, 48532.0)
    assert bench.prompt_copies(before, after) == {"ubatches": 2, "calls": 141.0, "regions": 4000.0,
                                                  "cache": 11000.0, "host": 4266.0}
    assert bench.prompt_copies(before, before) is None  # no large ubatch in between
    assert bench.prompt_copies(before, stats(5, 300, 9000, 1000.0, 40000.0)) is None  # no copy through the cache
    assert bench.prompt_copies(None, after) is None and bench.prompt_copies(before, None) is None  # no cache


def test_hybrid_setups(tiny: Path) -> None:
    # <cache setup>-hybrid and -auto: the same cache with Llama(moe_hybrid=True / "auto"), Python only (the native
    # tools have no option for it: they would run the cache alone under the setup's name)
    for base in ("cache-25", "cache-3mib", "cache-25-mmap"):
        plain = bench.setup_named(base)
        assert plain is not None and plain.hybrid is None and not plain.python_only
        for suffix, mode in (("-hybrid", True), ("-auto", "auto")):
            s = bench.setup_named(base + suffix)
            assert s is not None and s.name == base + suffix and s.hybrid == mode and s.python_only
            assert s.llama_kwargs == (*plain.llama_kwargs, ("moe_hybrid", mode))
            assert bench.cache_mib(tiny, s) == bench.cache_mib(tiny, plain) > 0
            assert (s.args, s.batched_args) == (plain.args, plain.batched_args)
            assert bench.measure(tiny, s, {}, [64], [64], 4, 1, run=lambda c, e: pytest.fail("no native run")) == []
    mapped = bench.setup_named("cache-25-hybrid-mmap")  # the suffixes in either order
    assert mapped is not None and dict(mapped.llama_kwargs) == {**dict(bench.SETUPS["cache-25"].llama_kwargs),
                                                               "load_mode": "mmap", "moe_hybrid": True}
    # only cache setups, once
    for bad in ("gpu-hybrid", "cpu_moe-none-auto", "cache-25-hybrid-auto", "cache-25-auto-auto", "fit-12gib-hybrid",
                "fit-12gib-cache-auto", "cache-x-hybrid", "-hybrid"):
        assert bench.setup_named(bad) is None, bad


def test_unknown_hybrid_setup_is_an_error(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main([str(tiny), "--setups", "cache-25-hybrid-auto"])
    assert "-hybrid or -auto" in capsys.readouterr().err


def hybrid_stats(n_host: int, busy_us: int, misses: int, predicted: int, host_max: int = 4) -> MoeCacheStats:
    return MoeCacheStats(hits_device=200, misses_device=misses, n_predicted=predicted, n_host=n_host, n_host_calls=8,
                         host_busy_us=busy_us, host_expert_us=30.0, upload_expert_us=50.0, handoff_us=4.0,
                         host_max=host_max)


def test_decode_hits_give_the_hybrid_split_per_token() -> None:
    before, after = hybrid_stats(10, 1000, 50, 2), hybrid_stats(50, 5000, 150, 10)
    got = bench.decode_hits(before, after, tokens=20)
    # 100 misses: 40 computed on the CPU in 20 tokens, 4 ms of its time; 60 uploaded with 8 predicted copies at 50 us
    assert got == pytest.approx({
        "hits": 0, "misses": 100, "hit_rate": 0.0, "host_max": 4, "host_expert_us": 30.0, "upload_expert_us": 50.0,
        "handoff_us": 4.0, "host_experts": 40, "host_busy_us": 4000, "uploaded": 68, "host_per_token": 2.0,
        "host_ms_per_token": 0.2, "uploaded_per_token": 3.4, "pcie_ms_per_token": 0.17,
        "predicted": 8, "predicted_used": 0, "hidden": 0.0, "wasted_mib": 0.0})
    # without the tokens, what it gave before: the hit rate (and the prediction's figures)
    assert set(bench.decode_hits(before, after)) == {"hits", "misses", "hit_rate", "predicted", "predicted_used",
                                                     "hidden", "wasted_mib"}
    assert bench.decode_hits(None, after, tokens=20) == {}


def tg_row(setup: str, stats: tuple[MoeCacheStats, MoeCacheStats] | None) -> bench.Row:
    return bench.Row(setup, {}, "python", 0, 512, 20, 50.0, cache={"tg": bench.decode_hits(*stats, tokens=20)}
                     if stats else {})


def test_table_has_the_hybrid_columns_where_it_ran() -> None:
    off = (hybrid_stats(0, 0, 40, 2, host_max=0), hybrid_stats(0, 0, 160, 10, host_max=0))
    on = (hybrid_stats(10, 1000, 50, 2), hybrid_stats(50, 5000, 150, 10))
    head = ("| setup | switches | via | tg20 | cache (decode) | prefetch staging | prompt copies per ubatch |")
    # without a hybrid setup or split, the table as it was
    assert bench.table([tg_row("cache-25", off), tg_row("gpu", None)]).splitlines()[0] == head
    text = bench.table([tg_row("cache-25", off), tg_row("cache-25-hybrid", on), tg_row("gpu", None)])
    lines = text.splitlines()
    assert lines[0] == head[:-1] + "| CPU experts/token | CPU ms/token | PCIe ms/token (est.) |"
    assert lines[1].count("---") == 10
    cells = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[-4:-1]] for ln in lines[2:]}
    # the cache alone: nothing on the CPU, 128 uploads in 20 tokens at 50 us; the hybrid: 2 experts a token on the
    # CPU (0.2 ms), 68 uploads (0.17 ms); all on the GPU: no cache, no figures
    assert cells == {"cache-25": ["0.00", "0.000", "0.320"], "cache-25-hybrid": ["2.00", "0.200", "0.170"],
                     "gpu": ["-", "-", "-"]}
    # "auto" that chose the CPU's share on a setup of another name shows them too
    assert "CPU experts/token" in bench.table([tg_row("cache-3mib", on)])


def test_api_rows_carry_the_split_to_the_json(tiny: Path) -> None:
    # a hybrid setup's Python run: moe_hybrid reaches the worker's Llama, and the split it reports is the row's
    from pyllama_moe.tools.bench.api import api_measure

    specs: list[dict[str, object]] = []
    tg = bench.decode_hits(*(hybrid_stats(10, 1000, 40, 2), hybrid_stats(50, 5000, 100, 10)), tokens=20)

    def run(cmd: list[str], env: dict[str, str]) -> str:
        specs.append(json.loads(cmd[-1]))
        return json.dumps({"pp_ts": 100.0, "pp_digest": "p", "n_gen": 20, "tg_ts": 50.0, "tg_digest": "t", "tg": tg})

    setup = bench.setup_named("cache-25-auto")
    assert setup is not None
    rows = api_measure(tiny, setup, {}, 64, 64, 20, run=run)
    assert specs[0]["kwargs"] == {**dict(setup.llama_kwargs), "moe_cache_mib": bench.cache_mib(tiny, setup)}
    assert specs[0]["kwargs"]["moe_hybrid"] == "auto"  # type: ignore[index]
    split = rows[1].cache["tg"]
    assert (split["host_max"], split["host_expert_us"], split["upload_expert_us"], split["handoff_us"]) == \
        (4, 30.0, 50.0, 4.0)


def test_cache_setups_run_where_the_cpu_stands_for_the_device(tiny: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # PYLLAMA_MOE_CACHE_CPU=1: the cache's setups (and the hybrid's) run their Python paths on the CPU, in the
    # workers' contexts made with moe_cache_cpu, a dry run of the GPU window's bench; without it they are skipped for
    # want of a GPU
    monkeypatch.setenv("PYLLAMA_MOE_CACHE_CPU", "1")
    out = tmp_path / "bench.json"
    rc = bench.main([str(tiny), "--setups", "cache-50,cache-50-hybrid", "--pp", "32", "--ub", "32", "--tg", "8",
                     "--reps", "1", "--no-native", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "not run" not in text, text
    rows = [r for r in json.loads(out.read_text())["rows"] if r["tool"] == "python"]
    assert sorted({r["setup"] for r in rows}) == ["cache-50", "cache-50-hybrid"]
    for r in rows:
        looked_up = r["cache"]["device lookups"]
        assert looked_up["hits"] + looked_up["misses"] > 0, r
        assert r["cache"]["placement"]["moe_cache_mib"] > 0
    assert "CPU experts/token" in text  # the hybrid's columns


# ---------------------------------------------------------------- --ttft: long prompts beside their PCIe bound


def test_pcie_bound_is_every_ubatchs_uploads() -> None:
    # by hand: 16 GB of experts a ubatch at 55 GB/s is 0.2909 s; a prompt's last ubatch uploads them all too
    assert bench.pcie_bound_s(65536, 512, 16_000_000_000, 55.0) == pytest.approx(128 * 16 / 55)  # 37.236 s
    assert bench.pcie_bound_s(2048, 4096, 16_000_000_000, 55.0) == pytest.approx(16 / 55)  # one ubatch, part full
    assert bench.pcie_bound_s(8192, 3000, 1_000_000_000, 50.0) == pytest.approx(3 / 50)  # 3000 + 3000 + 2192
    assert bench.pcie_bound_s(8192, 512, 0, 55.0) == 0.0


def test_upload_bytes_are_the_experts_not_on_the_gpu() -> None:
    e = 1000 << 20  # 1000 MiB of experts
    setup = bench.setup_named
    assert bench.upload_bytes(bench.SETUPS["cpu_moe-none"], e) == e
    assert bench.upload_bytes(bench.SETUPS["cpu_moe-mmap"], e) == e
    assert bench.upload_bytes(bench.SETUPS["cache-25"], e) == 750 << 20  # the cached 250 MiB come device to device
    assert bench.upload_bytes(bench.SETUPS["cache-50"], e) == 500 << 20
    assert bench.upload_bytes(setup("cache-50-mmap"), e) == 500 << 20
    assert bench.upload_bytes(setup("cache-300mib"), e) == 700 << 20
    assert bench.upload_bytes(setup("cache-2000mib"), e) == 0  # a cache larger than the experts
    assert bench.upload_bytes(bench.SETUPS["cache-10"], 1001 << 20) == 901 << 20  # the cache in whole MiB: 100
    assert bench.upload_bytes(bench.SETUPS["gpu"], e) == 0
    assert bench.upload_bytes(bench.SETUPS["dense-ffn-half"], e) is None  # no experts: the setup does not say
    assert bench.upload_bytes(setup("fit-8gib"), e) is None  # nor does a fit, whose placement is the run's


def test_ttft_rows_put_each_prompt_beside_its_bound() -> None:
    rows = [bench.Row("cpu_moe-none", {}, "llama-bench", 8192, 512, 0, 1024.0, ttft_s=8.01),  # an 8 s prompt
            bench.Row("cpu_moe-none", {}, "llama-bench", 0, 512, 16, 50.0),  # the decode: not a prompt's row
            bench.Row("cache-50", bench.PRISTINE, "llama-batched-bench", 8192, 4096, 0, 4096.0, ttft_s=2.02),
            bench.Row("gpu", {}, "llama-bench", 2048, 512, 0, 8192.0, ttft_s=0.26),
            bench.Row("cpu_moe-none", {}, "python", 8192, 512, 1, 900.0),  # --first's token: not a prompt's row
            bench.Row("cpu_moe-none", {}, "llama-bench", 2048, 512, 0, 1024.0, ttft_s=2.01)]
    got = bench.ttft_rows(rows, 16000 << 20, 50.0)
    assert [(t.setup, t.switches, t.via, t.n_prompt, t.n_ubatch) for t in got] == [
        ("cpu_moe-none", "-", "native", 2048, 512), ("cpu_moe-none", "-", "native", 8192, 512),
        ("cache-50", "pristine", "native", 8192, 4096), ("gpu", "-", "native", 2048, 512)]
    cpu, cache, gpu = got[1:]
    bound = 16 * (16000 << 20) / 50e9  # 16 ubatches of 16000 MiB at 50 GB/s: 5.369 s
    assert (cpu.upload_mib, cpu.prompt_s, cpu.bound_s) == (16000, 8.0, pytest.approx(bound))
    assert cpu.ratio == pytest.approx(8.0 / bound)
    assert (cache.upload_mib, cache.bound_s) == (8000, pytest.approx(2 * (8000 << 20) / 50e9))  # half cached
    assert (gpu.upload_mib, gpu.bound_s, gpu.ratio) == (0, 0.0, None)
    lines = bench.ttft_table(got).splitlines()
    assert lines[0] == ("| setup | switches | via | prompt | ubatch | TTFT s | prompt t/s | upload MiB/ubatch "
                        "| PCIe bound s | bound t/s | measured / bound |")
    assert lines[1].count("---") == 11 and len(lines) == 2 + 4
    assert lines[3] == "| cpu_moe-none | - | native | 8192 | 512 | 8.01 | 1024.0 | 16000.0 | 5.369 | 1525.9 | 1.49 |"
    assert lines[5] == "| gpu | - | native | 2048 | 512 | 0.26 | 8192.0 | 0.0 | 0 | - | - |"


def test_native_rows_carry_the_time_to_first_token(tiny: Path) -> None:
    # llama-bench: the prompt's time and one token of its decode; llama-batched-bench (--ttft: one run per ubatch
    # with every prompt at least that long): the prompt's time and one of the tokens decoded after it
    bench_out = "\n".join(json.dumps(r) for r in (
        {"n_prompt": 2048, "n_gen": 0, "n_ubatch": 512, "avg_ts": 1024.0, "stddev_ts": 0.0},
        {"n_prompt": 0, "n_gen": 16, "n_ubatch": 512, "avg_ts": 50.0, "stddev_ts": 0.0},
        {"n_prompt": 0, "n_gen": 16, "n_ubatch": 2048, "avg_ts": 40.0, "stddev_ts": 0.0}))
    rows = bench.measure(tiny, bench.SETUPS["cpu_moe-none"], {}, [2048], [512, 2048], 16, 1,
                         run=lambda cmd, env: bench_out)
    assert [(r.n_prompt, r.n_gen, r.ttft_s) for r in rows] == [(2048, 0, pytest.approx(2.02)), (0, 16, 0.0)]

    batched_out = "\n".join(json.dumps({"pp": pp, "tg": 16, "pl": 1, "t_pp": t_pp, "speed_pp": pp / t_pp,
                                        "t_tg": t_tg, "speed_tg": 16 / t_tg})
                            for pp, t_pp, t_tg in ((2048, 0.5, 0.2), (8192, 2.5, 0.32)))
    seen: list[list[str]] = []

    def fake(cmd: list[str], env: dict[str, str]) -> str:
        seen.append(cmd)
        return batched_out

    rows = bench.measure(tiny, bench.SETUPS["cache-50"], {}, [2048, 8192], [512, 4096], 16, 1, run=fake,
                         per_ubatch=True)
    assert [(c[c.index("-ub") + 1], c[c.index("-npp") + 1], c[c.index("-c") + 1], c[c.index("-b") + 1])
            for c in seen] == [("512", "2048,8192", "8224", "8192"), ("4096", "8192", "8224", "8192")]
    prompts = [r for r in rows if r.n_prompt]
    assert [(r.n_prompt, r.n_ubatch) for r in prompts] == [(2048, 512), (8192, 512), (2048, 4096), (8192, 4096)]
    assert [r.ttft_s for r in prompts[:2]] == [pytest.approx(0.5 + 0.2 / 16), pytest.approx(2.5 + 0.32 / 16)]
    seen.clear()
    bench.measure(tiny, bench.SETUPS["cache-50"], {}, [2048, 8192], [512, 4096], 16, 1, run=fake)
    assert len(seen) == 3  # without --ttft: a run per prompt and ubatch within it


def test_ttft_run_and_table(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pyllama_moe.gguf_info import GGUFInfo
    from pyllama_moe.tools.bench.ttft import TTFT_HEAD

    out = tmp_path / "bench.json"
    rc = bench.main([str(tiny), "--setups", "cpu_moe-none", "--pp", "64,512", "--ub", "64", "--tg", "4", "--reps", "1",
                     "--switch", "LLAMA_EXAMPLE_SWITCH", "--ttft", "--h2d-gbps", "20", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "MISMATCH" not in text, text
    assert "uploaded once per ubatch at 20.0 GB/s, --h2d-gbps" in text
    table = text[text.index("| setup | switches | via | prompt"):].split("\n\n")[0].splitlines()
    assert table[0].split("|")[1:-1] == [f" {h} " for h in TTFT_HEAD]
    # each prompt at each ubatch within it, --ub's and the default 512; the Python API at the largest
    assert [tuple(c.strip() for c in ln.split("|")[1:6]) for ln in table[2:]] == [
        ("cpu_moe-none", sw, via, p, u) for sw in ("-", "LLAMA_EXAMPLE_SWITCH=0")
        for via, runs in (("native", (("64", "64"), ("512", "64"), ("512", "512"))),
                          ("python", (("64", "64"), ("512", "512"))))
        for p, u in runs]
    data = json.loads(out.read_text())
    assert (data["ttft"]["h2d_gbps"], data["ttft"]["h2d_gbps_from"]) == (20.0, "--h2d-gbps")
    expert_bytes = GGUFInfo.read(tiny).expert_bytes
    trows = data["ttft"]["rows"]
    assert len(trows) == len(table) - 2
    for t in trows:
        assert t["ttft_s"] > t["prompt_s"] > 0, t  # a decoded token after the prompt
        assert t["upload_mib"] == expert_bytes / 2**20  # cpu_moe: every expert, every ubatch
        assert t["bound_s"] == pytest.approx(-(-t["n_prompt"] // t["n_ubatch"]) * expert_bytes / 20e9)
        assert t["ratio"] == pytest.approx(t["prompt_s"] / t["bound_s"])
    # the Python API times --first's one token after each prompt: its row is there too
    assert {(r["n_prompt"], r["n_gen"]) for r in data["rows"] if r["tool"] == "python" and r["n_prompt"]} == {
        (64, 0), (64, 1), (512, 0), (512, 1)}


def test_ttft_of_cache_setups_where_the_cpu_stands_for_the_device(tiny: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a cache's bound counts what is not cached; without a GPU to measure, the bandwidth is the documented default.
    # The tiny model's experts (54 KiB) fit the smallest cache (1 MiB) whole: these, 32 of 512 rows, are 3.4 MiB
    from pyllama_moe.gguf_info import GGUFInfo
    from pyllama_moe.tools import synth

    model = synth.write_model(tmp_path / "wide.gguf", "tiny", seed=3, n_expert=32, n_ff_exp=512)
    monkeypatch.setenv("PYLLAMA_MOE_CACHE_CPU", "1")
    out = tmp_path / "bench.json"
    # the Python API only: PYLLAMA_MOE_CACHE_CPU makes Llama's contexts, not the native tools', stand on the CPU
    rc = bench.main([str(model), "--setups", "cache-50", "--pp", "64", "--ub", "32", "--tg", "4", "--reps", "1",
                     "--ttft", "--no-native", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    data = json.loads(out.read_text())["ttft"]
    assert (data["h2d_gbps"], data["h2d_gbps_from"]) == (bench.DEFAULT_H2D_GBPS, "default")
    expert_bytes = GGUFInfo.read(model).expert_bytes
    cached = bench.cache_mib(model, bench.SETUPS["cache-50"]) << 20
    assert (expert_bytes, cached) == (3 * 32 * 64 * 512 * 18 // 32 * 2, 1 << 20)  # q4_0: 18 bytes a 32 weights
    assert {(t["via"], t["n_prompt"], t["n_ubatch"]) for t in data["rows"]} == {("python", 64, 32)}
    for t in data["rows"]:
        assert t["upload_mib"] * 2**20 == expert_bytes - cached > 0
        assert t["bound_s"] == pytest.approx(2 * (expert_bytes - cached) / 55e9)
        assert t["ttft_s"] > t["prompt_s"] > 0


def test_ttft_argument_errors(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args, message in ((["--h2d-gbps", "30"], "--h2d-gbps is the bandwidth of --ttft's PCIe bound"),
                          (["--ttft", "--h2d-gbps", "0"], "--h2d-gbps takes a positive bandwidth in GB/s, got 0"),
                          (["--ttft", "--h2d-gbps", "-5"], "got -5"),
                          (["--ttft", "--tg", "0"], "--ttft times the prompt and one decoded token: --tg must be")):
        with pytest.raises(SystemExit) as e:
            bench.main([str(tiny), "--setups", "cpu_moe-none", *args])
        assert e.value.code == 2 and message in capsys.readouterr().err, args


def test_ttft_default_ubatch_is_llamas() -> None:
    import inspect

    from pyllama_moe import Llama

    assert inspect.signature(Llama).parameters["n_ubatch"].default == bench.DEFAULT_UBATCH


def test_a_long_prompt_repeats_the_text() -> None:
    from pyllama_moe.tools.bench.worker import repeated

    assert repeated([1, 2, 3], 7) == [1, 2, 3] * 3
    assert repeated([1, 2, 3], 2) == repeated([1, 2, 3], 3) == [1, 2, 3]
    with pytest.raises(ValueError, match="no tokens"):
        repeated([], 4)
