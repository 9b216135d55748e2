"""espeak-ng speech synthesis from pip: libespeak-ng called in-process (ctypes) from the ``espeakng-loader`` wheel,
which bundles the library and its voice data, so nothing but Python and pip is needed. Where that wheel is absent
the system ``espeak-ng`` (or ``espeak``) binary is the fallback.

The in-process path makes the calls the command line ``espeak-ng -D -v<voice> -p<pitch> -s<rate> -a<amplitude>
-w out.wav "<text>"`` makes: ``espeak_Initialize`` for synchronous output (as ``-w`` does) with the bundled data,
the random seed fixed to 1 (``-D``; espeak-ng 1.52 otherwise seeds its breath noise from the clock, so ``en-us+f3``
would differ between runs), a callback collecting the int16 samples, the voice set by name (``en-us+m3`` syntax),
``espeakRATE``, ``espeakVOLUME`` and ``espeakPITCH`` set absolutely, then ``espeak_Synth`` with the command line's
flags (``espeakCHARS_AUTO | espeakPHONEMES | espeakENDPAUSE``). libespeak-ng keeps state between utterances in
function-level statics (the pitch-flutter phase), so a clip would depend on what was synthesised before it in the
same process; every clip therefore loads a private copy of the library afresh, exactly as each command-line run
starts from a fresh process (about 20 ms a clip). One module-level lock serialises the calls, so threads of one
process may call `speak` concurrently. The binary fallback passes ``-D`` where its version has it (1.52 and later).

Same samples from both back-ends? At the same espeak-ng version and voice data, yes: this module's library path run
on Debian 12's libespeak-ng 1.51 gave the Debian ``espeak-ng`` 1.51 binary's samples bit for bit on all 800 clips of
`datamodules.paralinguistic_speech` (50 sentences x 16 controls). Across versions, no: ``espeakng-loader`` 0.2.4
bundles espeak-ng 1.52.0, and against the 1.51 binary 376 of those 800 clips are identical, 754 have the same
length (length ratio 0.997-1.018, mean 1.0003), Pearson correlation of the samples 0.977 on average (min 0.34;
10 ms RMS envelopes 0.997, min 0.81). The differences: 1.52 pronounces 3 of the 50 sentences differently (24 clips
of the ``m3`` voice), and its breath noise (``f3``, all 400 clips) comes from its own seeded generator instead of
the C library's ``rand()`` (correlation >= 0.994 on the other 47 sentences). Results measured with one version
are therefore not bit-identical with another; `version` belongs in every cache key built on this module, the
back-end does not.
"""
from __future__ import annotations

import _ctypes
import atexit
import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import wave
from typing import Literal

import numpy as np

from lightning_modules.shared.errors import UserInputError

# speak_lib.h / espeak_ng.h
AUDIO_OUTPUT_SYNCHRONOUS = 2
ESPEAK_INITIALIZE_DONT_EXIT = 0x8000
ESPEAK_RATE, ESPEAK_VOLUME, ESPEAK_PITCH = 1, 2, 3
POS_CHARACTER = 1
ESPEAK_CHARS_AUTO, ESPEAK_PHONEMES, ESPEAK_ENDPAUSE = 0, 0x100, 0x1000
SYNTH_FLAGS = ESPEAK_CHARS_AUTO | ESPEAK_PHONEMES | ESPEAK_ENDPAUSE    # the command line's default flags
EE_OK = 0
RANDOM_SEED = 1                                                       # the command line's -D
LIMITS = {"rate": (80, 450), "pitch": (0, 99), "amplitude": (0, 200)}
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)

Backend = Literal["library", "binary"]
INSTALL_HINT = "Install the espeakng-loader wheel (`pip install espeakng-loader`, one of this package's requirements)"
_LOCK = threading.Lock()
_CHUNKS: list[bytes] = []      # the samples of the clip being synthesised (written under _LOCK)
_VERSIONS: dict[str, str] = {}
_PRIVATE: dict[str, str] = {}  # original library path -> its private copy
_LIBC: list = []               # the C library's srand, looked up once


def _collect(wav, numsamples: int, events) -> int:
    if wav and numsamples > 0:
        _CHUNKS.append(ctypes.string_at(wav, 2 * numsamples))
    return 0                                                          # 0 = go on synthesising


_CALLBACK = _SYNTH_CALLBACK(_collect)                                 # module-level: never garbage-collected


def library_available() -> bool:
    """Whether the ``espeakng-loader`` wheel (libespeak-ng and its voice data) is importable."""
    try:
        import espeakng_loader  # noqa: F401
    except ImportError:
        return False
    return True


def espeak_binary() -> str | None:
    """Path of the system espeak-ng (or espeak) binary, None when neither is on PATH. Only a fallback for a machine
    without the ``espeakng-loader`` wheel (a dependency in setup.cfg, so a fresh pip install never needs it)."""
    return shutil.which("espeak-ng") or shutil.which("espeak")


def backend() -> Backend | None:
    """The back-end `speak` uses by default: the wheel's library, else the system binary, else None."""
    if library_available():
        return "library"
    return "binary" if espeak_binary() else None


def _require(chosen: Backend | None) -> Backend:
    if chosen not in (None, "library", "binary"):
        raise UserInputError(f"espeak-ng back-end must be 'library' or 'binary', got {chosen!r}.")
    chosen = chosen or backend()
    if chosen is None:
        raise UserInputError(f"espeak-ng is not available, so speech cannot be synthesised. {INSTALL_HINT}, or put "
                             f"the espeak-ng binary on PATH.")
    if chosen == "library" and not library_available():
        raise UserInputError(f"the espeak-ng library back-end needs the espeakng-loader wheel. {INSTALL_HINT}.")
    if chosen == "binary" and espeak_binary() is None:
        raise UserInputError("the espeak-ng binary back-end needs espeak-ng on PATH (`apt-get install espeak-ng`, "
                             "`brew install espeak-ng`); the default library back-end does not.")
    return chosen


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


# ============================================================================================ library (in-process)
def _wheel_paths() -> tuple[str, str]:
    import espeakng_loader

    return espeakng_loader.get_library_path(), espeakng_loader.get_data_path()


def _private_copy(library: str) -> str:
    """A copy of the shared library under a name only this module opens, so closing it really unloads it (another
    package holding the wheel's library open would otherwise keep its state alive between clips)."""
    if library not in _PRIVATE:
        folder = tempfile.mkdtemp(prefix="icml26-espeak-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        copy = os.path.join(folder, os.path.basename(library))
        shutil.copy2(library, copy)
        _PRIVATE[library] = copy
    return _PRIVATE[library]


def _open(library: str, data: str) -> tuple[ctypes.CDLL, int]:
    lib = ctypes.CDLL(_private_copy(library))
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_Info.argtypes, lib.espeak_Info.restype = [ctypes.c_void_p], ctypes.c_char_p
    lib.espeak_SetSynthCallback.argtypes, lib.espeak_SetSynthCallback.restype = [_SYNTH_CALLBACK], None
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                 ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    rate = lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, data.encode(), ESPEAK_INITIALIZE_DONT_EXIT)
    if rate <= 0:
        _close(lib)
        raise UserInputError(f"libespeak-ng ({library}) failed to initialise with the voice data at {data}. "
                             f"Reinstall it: `pip install --force-reinstall espeakng-loader`.")
    return lib, rate


def _close(lib: ctypes.CDLL) -> None:
    lib.espeak_Terminate()
    unload = getattr(_ctypes, "dlclose", None) or _ctypes.FreeLibrary        # FreeLibrary on Windows
    unload(lib._handle)


def _seed(lib: ctypes.CDLL) -> None:
    """Fix the breath-noise generator as ``espeak-ng -D`` does; espeak-ng before 1.52 draws from the C library's
    rand(), which a fresh process starts at seed 1 (the C library's state is reset as a side effect)."""
    if hasattr(lib, "espeak_ng_SetRandSeed"):
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        lib.espeak_ng_SetRandSeed(RANDOM_SEED)
    if not _LIBC:
        _LIBC.append(None)
        if sys.platform != "win32":
            libc = ctypes.CDLL(ctypes.util.find_library("c"))
            libc.srand.argtypes, libc.srand.restype = [ctypes.c_uint], None
            _LIBC[0] = libc.srand
    if _LIBC[0] is not None:
        _LIBC[0](1)


def _library_version(library: str, data: str) -> str:
    if library not in _VERSIONS:
        lib, _ = _open(library, data)
        try:
            _VERSIONS[library] = lib.espeak_Info(None).decode().split()[0]
        finally:
            _close(lib)
    return _VERSIONS[library]


def _library_speak(library: str, data: str, text: str, voice: str, rate: int, pitch: int,
                   amplitude: int) -> tuple[np.ndarray, int]:
    lib, sample_rate = _open(library, data)
    try:
        _seed(lib)
        lib.espeak_SetSynthCallback(_CALLBACK)
        if lib.espeak_SetVoiceByName(voice.encode()) != EE_OK:
            raise UserInputError(f"espeak-ng has no voice '{voice}'. Give a language with an optional variant, e.g. "
                                 f"'en-us' or 'en-us+f3'.")
        for parameter, value in ((ESPEAK_RATE, rate), (ESPEAK_VOLUME, amplitude), (ESPEAK_PITCH, pitch)):
            lib.espeak_SetParameter(parameter, value, 0)
        _CHUNKS.clear()
        encoded = text.encode()
        status = lib.espeak_Synth(encoded, len(encoded) + 1, 0, POS_CHARACTER, 0, SYNTH_FLAGS, None, None)
        if status != EE_OK or lib.espeak_Synchronize() != EE_OK:
            raise RuntimeError(f"libespeak-ng failed (status {status}) on {text!r} with voice '{voice}'.")
        samples = np.frombuffer(b"".join(_CHUNKS), dtype=np.int16).copy()
        _CHUNKS.clear()
    finally:
        _close(lib)
    return samples, sample_rate


# ============================================================================================ binary (fallback)
def _binary_version(binary: str) -> str:
    if binary not in _VERSIONS:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
        match = re.search(r"text-to-speech:\s*(\S+)", out)
        if match is None:
            raise RuntimeError(f"cannot read the version of {binary} from `{binary} --version`: {out!r}")
        _VERSIONS[binary] = match.group(1)
    return _VERSIONS[binary]


def _binary_speak(binary: str, text: str, voice: str, rate: int, pitch: int, amplitude: int) -> tuple[np.ndarray, int]:
    deterministic = ["-D"] if _version_tuple(_binary_version(binary)) >= (1, 52) else []
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "clip.wav")
        done = subprocess.run([binary, *deterministic, f"-v{voice}", f"-p{pitch}", f"-s{rate}", f"-a{amplitude}",
                               "-w", raw, text], capture_output=True, text=True, check=False)
        if done.returncode != 0 or not os.path.isfile(raw):
            raise UserInputError(f"{binary} failed with voice '{voice}': {done.stderr.strip() or 'no output'}. "
                                 f"Check the voice name (`{binary} --voices`).")
        with wave.open(raw, "rb") as handle:
            return np.frombuffer(handle.readframes(handle.getnframes()), dtype=np.int16).copy(), handle.getframerate()


# ============================================================================================ API
def version(chosen: Backend | None = None) -> str:
    """The espeak-ng version number of a back-end (default: the one `speak` uses), e.g. ``1.52.0``."""
    chosen = _require(chosen)
    with _LOCK:
        return _library_version(*_wheel_paths()) if chosen == "library" else _binary_version(espeak_binary())


def speak(text: str, voice: str = "en-us", rate: int = 175, pitch: int = 50, amplitude: int = 100,
          chosen: Backend | None = None) -> tuple[np.ndarray, int]:
    """Synthesise ``text``: (float32 waveform in [-1, 1), the back-end's sample rate; 22,050 Hz for espeak-ng).

    ``voice`` as ``-v`` (``en-us``, ``en-us+f3``), ``rate`` in words per minute (``-s``), ``pitch`` 0-99 (``-p``),
    ``amplitude`` 0-200 (``-a``). ``chosen`` forces a back-end (default: the library, else the binary). The same
    arguments give the same samples on every call.
    """
    for name, value in (("rate", rate), ("pitch", pitch), ("amplitude", amplitude)):
        low, high = LIMITS[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise UserInputError(f"espeak-ng {name} must be an integer in [{low}, {high}], got {value!r}.")
    if not isinstance(text, str) or not text.strip():
        raise UserInputError(f"espeak-ng needs non-empty text to speak, got {text!r}.")
    if not isinstance(voice, str) or not voice or voice.startswith("-"):
        raise UserInputError(f"espeak-ng voice must be a name such as 'en-us' or 'en-us+f3', got {voice!r}.")
    chosen = _require(chosen)
    with _LOCK:
        if chosen == "library":
            samples, sample_rate = _library_speak(*_wheel_paths(), text, voice, rate, pitch, amplitude)
        else:
            samples, sample_rate = _binary_speak(espeak_binary(), text, voice, rate, pitch, amplitude)
    return samples.astype(np.float32) / 32768.0, sample_rate


__all__ = ["speak", "version", "backend", "library_available", "espeak_binary"]
