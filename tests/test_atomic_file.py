from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpu_workers.atomic_file import write_atomically


def test_concurrent_writers_and_readers_see_whole_files_only(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "meta.json"
    contents = {bytes([65 + n]) * 50_000 for n in range(8)}

    def write(n: int) -> None:
        for _ in range(100):
            write_atomically(target, bytes([65 + n]) * 50_000)

    def read(_: int) -> set[bytes]:
        seen = set()
        for _ in range(400):
            if target.exists():
                seen.add(target.read_bytes())
        return seen

    with ThreadPoolExecutor(max_workers=12) as pool:
        writers = [pool.submit(write, n) for n in range(8)]
        readers = [pool.submit(read, n) for n in range(4)]
        for w in writers:
            w.result()
        seen = set().union(*(r.result() for r in readers))
    assert seen <= contents
    assert target.read_bytes() in contents
    assert [p.name for p in target.parent.iterdir()] == ["meta.json"]  # no temporaries left
