"""llama_available_memory (patch 0011) on fake /proc and /sys/fs/cgroup trees: the system's available
memory within every cgroup limit up to the root, page cache other than shmem and mlocked pages
counted as reclaimable."""

from __future__ import annotations

from pathlib import Path

from pyllama_moe import moe

GIB = 1 << 30


def tree(root: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(root)


def meminfo(avail_gib: float) -> str:
    return f"MemTotal:       {64 << 20} kB\nMemFree:        1000 kB\nMemAvailable:   {int(avail_gib * (1 << 20))} kB\n"


def stat_v2(file: int = 0, shmem: int = 0, unevictable: int = 0) -> str:
    return f"anon 123\nfile {file}\nshmem {shmem}\nunevictable {unevictable}\n"


def test_no_cgroup_limit_is_mem_available(tmp_path: Path) -> None:
    root = tree(tmp_path, {"proc/meminfo": meminfo(10), "proc/self/cgroup": "0::/\n",
                           "sys/fs/cgroup/cgroup.controllers": "memory\n", "sys/fs/cgroup/memory.max": "max\n"})
    assert moe.available_memory(root) == 10 * GIB


def test_v2_nested_limits_take_the_smallest_room(tmp_path: Path) -> None:
    cg = "sys/fs/cgroup"
    root = tree(tmp_path, {
        "proc/meminfo": meminfo(100), "proc/self/cgroup": "0::/user.slice/app\n", f"{cg}/cgroup.controllers": "memory",
        # the parent leaves 8 GiB + 2 GiB of reclaimable cache (3 GiB file - 1 GiB shmem)
        f"{cg}/user.slice/memory.max": str(40 * GIB), f"{cg}/user.slice/memory.current": str(32 * GIB),
        f"{cg}/user.slice/memory.stat": stat_v2(file=3 * GIB, shmem=GIB),
        # the process's cgroup leaves 12 GiB + 0 (its cache is all mlocked)
        f"{cg}/user.slice/app/memory.max": str(20 * GIB), f"{cg}/user.slice/app/memory.current": str(8 * GIB),
        f"{cg}/user.slice/app/memory.stat": stat_v2(file=2 * GIB, unevictable=2 * GIB),
    })
    assert moe.available_memory(root) == 10 * GIB


def test_v2_exhausted_cgroup_leaves_nothing(tmp_path: Path) -> None:
    cg = "sys/fs/cgroup"
    root = tree(tmp_path, {
        "proc/meminfo": meminfo(100), "proc/self/cgroup": "0::/job\n", f"{cg}/cgroup.controllers": "memory",
        f"{cg}/job/memory.max": str(4 * GIB), f"{cg}/job/memory.current": str(5 * GIB),
        f"{cg}/job/memory.stat": stat_v2(file=GIB // 2),
    })
    assert moe.available_memory(root) == 0


def test_v1_hierarchy_uses_the_totals(tmp_path: Path) -> None:
    mem = "sys/fs/cgroup/memory"
    unlimited = "9223372036854771712"
    root = tree(tmp_path, {
        "proc/meminfo": meminfo(50),
        "proc/self/cgroup": "9:name=systemd:/\n4:cpu,memory:/docker/abc\n0::/\n",
        f"{mem}/memory.limit_in_bytes": unlimited, f"{mem}/memory.usage_in_bytes": str(GIB),
        f"{mem}/docker/memory.limit_in_bytes": unlimited,
        f"{mem}/docker/abc/memory.limit_in_bytes": str(16 * GIB),
        f"{mem}/docker/abc/memory.usage_in_bytes": str(14 * GIB),
        # 6 GiB of cache in the hierarchy, of which 1 GiB shmem and 1 GiB mlocked: 4 GiB reclaimable
        f"{mem}/docker/abc/memory.stat": f"cache 1\nshmem 0\ntotal_cache {6 * GIB}\ntotal_shmem {GIB}\n"
                                         f"total_unevictable {GIB}\n",
    })
    assert moe.available_memory(root) == 6 * GIB


def test_system_memory_below_the_cgroup_room_wins(tmp_path: Path) -> None:
    cg = "sys/fs/cgroup"
    root = tree(tmp_path, {
        "proc/meminfo": meminfo(3), "proc/self/cgroup": "0::/a\n", f"{cg}/cgroup.controllers": "memory",
        f"{cg}/a/memory.max": str(32 * GIB), f"{cg}/a/memory.current": str(GIB), f"{cg}/a/memory.stat": stat_v2(),
    })
    assert moe.available_memory(root) == 3 * GIB


def test_unknown_without_meminfo(tmp_path: Path) -> None:
    assert moe.available_memory(str(tmp_path)) is None
    assert moe.available_memory() is None or moe.available_memory() > 0  # this machine


def test_hybrid_layout_reads_the_unified_mount(tmp_path: Path) -> None:
    uni = "sys/fs/cgroup/unified"
    root = tree(tmp_path, {
        "proc/meminfo": meminfo(100), "proc/self/cgroup": "4:memory:/\n0::/svc\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
        f"{uni}/cgroup.controllers": "", f"{uni}/svc/memory.max": str(8 * GIB),
        f"{uni}/svc/memory.current": str(6 * GIB), f"{uni}/svc/memory.stat": stat_v2(file=GIB),
    })
    assert moe.available_memory(root) == 3 * GIB
