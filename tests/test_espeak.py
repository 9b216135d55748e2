"""espeak-ng from pip (`datamodules.espeak`): the in-process library of the espeakng-loader wheel speaks, is
deterministic (also after other clips, and from concurrent threads), validates its input; the binary fallback gets
the command line it should; the PCLM cache key holds version, controls and text but not the back-end; and the PCLM
quick config trains with no espeak-ng binary on PATH."""
from __future__ import annotations

import os
import platform
import re
import shutil
import stat
import sys
import threading

import numpy as np
import pytest

from conftest import config_path, run_cli
from datamodules import espeak, paralinguistic_speech
from datamodules.paralinguistic_speech import synthesise
from lightning_modules.shared.errors import UserInputError

SENTENCE = "the train leaves the station at noon"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64", "arm64"),
                    reason="espeakng-loader has no wheel for this platform (setup.cfg); the espeak-ng binary is used")
def test_the_wheel_library_is_the_default_back_end():
    assert espeak.library_available(), "espeakng-loader is a requirement of this package on this platform"
    assert espeak.backend() == "library"
    assert espeak.version() == espeak.version("library")
    assert len(espeak._version_tuple(espeak.version())) >= 2


def test_a_short_sentence_is_non_silent_of_plausible_length_and_deterministic():
    audio, rate = espeak.speak(SENTENCE, voice="en-us+f3", rate=175, pitch=50, amplitude=100)
    assert rate == 22_050 and audio.dtype == np.float32
    seconds = len(audio) / rate
    assert 1.0 < seconds < 5.0, seconds                        # 7 words at 175 words per minute: about 2.4 s
    assert np.abs(audio).max() <= 1.0
    assert np.sqrt(np.mean(audio ** 2)) > 0.01                  # speech, not silence
    voiced = np.abs(audio) > 0.01
    assert 0.3 < voiced.mean() < 0.95                           # speech with pauses
    # another clip in between must not change it (libespeak-ng keeps state between utterances; every clip starts
    # from a freshly loaded library), and f3's breath noise is seeded
    espeak.speak("something else entirely", voice="en-us+m3", rate=300, pitch=10, amplitude=50)
    again, _ = espeak.speak(SENTENCE, voice="en-us+f3", rate=175, pitch=50, amplitude=100)
    assert np.array_equal(audio, again)


def median_f0(audio: np.ndarray, rate: int = 22_050) -> float:
    """Median fundamental frequency (Hz) of the loud 46 ms frames: the autocorrelation peak between 60 and 400 Hz."""
    estimates = []
    for start in range(0, len(audio) - 1024, 512):
        frame = audio[start:start + 1024] - audio[start:start + 1024].mean()
        if np.sqrt(np.mean(frame ** 2)) < 0.05 * np.abs(audio).max():
            continue
        correlation = np.correlate(frame, frame, "full")[1023:]
        low, high = rate // 400, rate // 60
        estimates.append(rate / (low + np.argmax(correlation[low:high])))
    return float(np.median(estimates))


def test_the_controls_change_the_audio_as_the_command_line_flags_do():
    base, rate = espeak.speak(SENTENCE, voice="en-us+m3", rate=110, pitch=20, amplitude=100)
    fast, _ = espeak.speak(SENTENCE, voice="en-us+m3", rate=230, pitch=20, amplitude=100)
    loud, _ = espeak.speak(SENTENCE, voice="en-us+m3", rate=110, pitch=20, amplitude=180)
    high, _ = espeak.speak(SENTENCE, voice="en-us+m3", rate=110, pitch=80, amplitude=100)
    female, _ = espeak.speak(SENTENCE, voice="en-us+f3", rate=110, pitch=20, amplitude=100)
    assert len(fast) < 0.7 * len(base)
    assert np.abs(loud).mean() > 1.4 * np.abs(base).mean()
    # measured: m3 about 82 Hz at -p20 and 141 Hz at -p80, f3 about 165 Hz at -p20
    assert 60 < median_f0(base) < 110 and median_f0(high) > 1.4 * median_f0(base)
    assert median_f0(female) > 1.6 * median_f0(base)


def test_concurrent_threads_get_the_serial_samples():
    texts = [SENTENCE, "a cat is sleeping on the chair", "please close the door behind you"]
    serial = [espeak.speak(t, voice="en-us+f3")[0] for t in texts]
    results: dict[int, np.ndarray] = {}

    def work(i):
        results[i] = espeak.speak(texts[i % 3], voice="en-us+f3")[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(np.array_equal(results[i], serial[i % 3]) for i in range(6))


@pytest.mark.parametrize("kwargs, words", [
    ({"voice": "xx-nothing"}, "no voice 'xx-nothing'"),
    ({"rate": 10}, "rate must be an integer in [80, 450]"),
    ({"pitch": 1.5}, "pitch must be an integer in [0, 99]"),
    ({"amplitude": 500}, "amplitude must be an integer in [0, 200]"),
    ({"voice": "-w/tmp/x"}, "voice must be a name"),
    ({"chosen": "cloud"}, "back-end must be 'library' or 'binary'"),
])
def test_bad_arguments_are_one_clear_error(kwargs, words):
    with pytest.raises(UserInputError, match=re.escape(words)):
        espeak.speak(SENTENCE, **kwargs)
    with pytest.raises(UserInputError, match="non-empty text"):
        espeak.speak("   ")


FAKE_BINARY = """#!{python}
import sys, wave
import numpy as np
if "--version" in sys.argv:
    print("eSpeak NG text-to-speech: {version}  Data at: /nowhere")
    sys.exit(0)
open({log!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
with wave.open(sys.argv[sys.argv.index("-w") + 1], "wb") as out:
    out.setnchannels(1); out.setsampwidth(2); out.setframerate(22050)
    out.writeframes((np.arange(2205) % 100 * 300).astype(np.int16).tobytes())
"""


def fake_binary(folder, version: str) -> str:
    """An `espeak-ng` on PATH that reports ``version``, logs its arguments and writes a known 0.1 s wav."""
    folder.mkdir(exist_ok=True)
    path, log = folder / "espeak-ng", folder / "calls.log"
    path.write_text(FAKE_BINARY.format(python=sys.executable, version=version, log=str(log)))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(log)


@pytest.mark.parametrize("version, deterministic", [("1.52.0", True), ("1.51", False)])
def test_the_binary_fallback_gets_the_command_line_of_the_library_path(tmp_path, monkeypatch, version, deterministic):
    log = fake_binary(tmp_path / f"bin{version}", version)
    monkeypatch.setenv("PATH", str(tmp_path / f"bin{version}"))
    monkeypatch.setattr(espeak, "library_available", lambda: False)
    monkeypatch.setattr(espeak, "_VERSIONS", {})
    assert espeak.backend() == "binary" and espeak.version() == version
    audio, rate = espeak.speak("hello there", voice="en-us+f3", rate=110, pitch=80, amplitude=180)
    assert rate == 22_050 and len(audio) == 2205
    assert np.array_equal(audio, (np.arange(2205) % 100 * 300).astype(np.float32) / 32768)
    arguments = open(log).read().split()
    assert arguments[-4:-2] == ["-w", arguments[-3]] and arguments[-2:] == ["hello", "there"]
    assert ("-D" in arguments) == deterministic               # -D (fixed noise seed) exists from 1.52 on
    assert {"-ven-us+f3", "-p80", "-s110", "-a180"} <= set(arguments)


def test_no_back_end_at_all_names_the_pip_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(espeak, "library_available", lambda: False)
    assert espeak.backend() is None
    with pytest.raises(UserInputError, match="pip install espeakng-loader"):
        synthesise(SENTENCE, "low", "slow", "male", "quiet", str(tmp_path / "cache"))
    with pytest.raises(UserInputError, match="pip install espeakng-loader"):
        espeak.speak(SENTENCE)


def test_the_cache_key_holds_version_controls_and_text_but_not_the_back_end(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    first = synthesise(SENTENCE, "high", "fast", "female", "loud", cache)
    assert len(os.listdir(cache)) == 1

    def must_not_synthesise(*args, **kwargs):
        raise AssertionError("cache miss")

    # the binary back-end at the same version reads the library's clip
    version = espeak.version()
    monkeypatch.setattr(espeak, "backend", lambda: "binary")
    monkeypatch.setattr(espeak, "version", lambda chosen=None: version)
    monkeypatch.setattr(espeak, "speak", must_not_synthesise)
    assert np.array_equal(synthesise(SENTENCE, "high", "fast", "female", "loud", cache), first)
    # every control, the text and the version are in the key: changing any one misses the cache
    calls = []

    def record(text, **kwargs):
        calls.append((text, kwargs))
        return np.zeros(441, np.float32), 22_050

    monkeypatch.setattr(espeak, "speak", record)
    for args in [("low", "fast", "female", "loud"), ("high", "slow", "female", "loud"),
                 ("high", "fast", "male", "loud"), ("high", "fast", "female", "quiet")]:
        synthesise(SENTENCE, *args, cache)
    synthesise("another sentence", "high", "fast", "female", "loud", cache)
    monkeypatch.setattr(espeak, "version", lambda chosen=None: "0.0.1")
    synthesise(SENTENCE, "high", "fast", "female", "loud", cache)
    assert len(calls) == 6 and len(os.listdir(cache)) == 7
    assert calls[0] == (SENTENCE, {"voice": "en-us+f3", "rate": 230, "pitch": 20, "amplitude": 180})
    lengths = sorted(len(np.load(os.path.join(cache, name))) for name in os.listdir(cache))
    assert lengths == [320] * 6 + [len(first)]                 # 441 samples at 22,050 Hz are 320 at 16 kHz


def test_the_embedded_clips_are_the_library_samples_resampled_to_16k(tmp_path):
    from math import gcd

    from scipy.signal import resample_poly

    clip = synthesise(SENTENCE, "low", "slow", "male", "quiet", str(tmp_path))
    raw, rate = espeak.speak(SENTENCE, voice="en-us+m3", rate=110, pitch=20, amplitude=25)
    g = gcd(16_000, rate)
    assert np.array_equal(clip, resample_poly(raw, 16_000 // g, rate // g).astype(np.float32))
    assert paralinguistic_speech.SAMPLE_RATE == 16_000


def test_the_pclm_quick_config_trains_without_an_espeak_binary(tmp_path, monkeypatch, prerequisite_args):
    """configs/pclm/quick.yaml (with its SFT prerequisite) with PATH holding no espeak-ng and an empty clip cache:
    every clip is synthesised by the wheel's library."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("espeak-ng") is None and shutil.which("espeak") is None
    config = "configs/pclm/quick.yaml"
    prerequisite = prerequisite_args(config)                    # the SFT checkpoint (built here, or earlier)
    monkeypatch.setenv("ICML26_CACHE", str(tmp_path / "clips"))
    cli = run_cli("fit", "--config", config_path(config), *prerequisite,
                  "--data.init_args.num_train=16", "--data.init_args.num_val=8", "--data.init_args.num_test=8",
                  "--data.init_args.batch_size=8", "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
                  "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                  f"--trainer.default_root_dir={tmp_path / 'run'}")
    assert cli.trainer.global_step == 2
    assert len(os.listdir(tmp_path / "clips")) >= 16              # synthesised here, not read from a cache
