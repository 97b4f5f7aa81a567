"""A designed audio projector: a Voxtral-type ("voxtral") Whisper encoder for the default model
whose weights tell a low tone from a high one and hand the language model a word for each.

libmtmd turns 16 kHz samples into Whisper's log-mel spectrogram (80 bins here, floored 8
decades under its peak and scaled by a quarter), then runs the encoder: two 1-D
convolutions with GELU, transformer layers, frames stacked in groups, and an MLP. Here:

- the first convolution's two live channels measure how far a frame's energy in the low
  band (mel bins under 1 kHz) and in the high band (over 2 kHz) stands above the frame's
  mean, so a tone lights one of them and silence neither; the second passes them on;
- the layer adds nothing (its output matrices are zero) and the position table is zero;
- the MLP averages a channel over the frames of a stacked group and maps it to the input
  embedding of that band's word, read from the text model's own `token_embd`.

A clip of a 440 Hz tone then reaches the model as the low word, one of 3 kHz as the high
word, a token for every two seconds of sound (libmtmd's 30-second window gives 15; silence
gives zeros): proof that samples went through the mel front end, the encoder and the
projector into the right cells. SmolLM2 follows colour words best, so the tests have the low
tone say "red" and the high one "blue" and ask the colour question of tests/test_vision.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from helpers.projector import word_embeddings, write_clip

N_MEL = 80
RATE = 16000
WIDTH = 8  # the encoder's width; channels 0 and 1 carry the two bands
STACK = 50  # encoder frames per token
LOW_HZ, HIGH_HZ = 440.0, 3000.0
BAND = 6  # mel bins nearest each tone
GAIN = 40.0  # on the band measures, so that a lit band is a few units after GELU
LIT = (46.0, 24.4)  # what each band's channel averages over a group when its tone sounds (measured)


def _mel_centres() -> np.ndarray:
    """The centre frequency of each of libmtmd's mel bins (Slaney's scale, 0-8 kHz)."""
    step = math.log(6.4) / 27.0

    def to_mel(f: float) -> float:
        return f * 3 / 200 if f < 1000 else 15.0 + math.log(f / 1000) / step

    def to_hz(m: float) -> float:
        return m * 200 / 3 if m < 15.0 else 1000 * math.exp((m - 15.0) * step)

    top = to_mel(RATE / 2)
    return np.array([to_hz(top * (i + 1) / (N_MEL + 1)) for i in range(N_MEL)])


def write_tone_projector(path: Path, model: Path, words: tuple[str, str] = ("red", "blue"),
                         n_embd: int | None = None) -> Path:
    """`words`: what a low tone and a high tone say to the model; `n_embd` cuts the output
    narrower than the model's (a projector made for another model)."""
    width, embeddings = word_embeddings(model, list(words))
    width = n_embd or width
    centres = _mel_centres()
    conv1 = np.zeros((WIDTH, N_MEL, 3), np.float32)  # (out, in, kernel): the centre tap only
    for channel, hz in enumerate((LOW_HZ, HIGH_HZ)):
        band = np.zeros(N_MEL)
        band[np.argsort(np.abs(centres - hz))[:BAND]] = 1.0
        conv1[channel, :, 1] = GAIN * (band / BAND - 1.0 / N_MEL)
    conv2 = np.zeros((WIDTH, WIDTH, 3), np.float32)
    conv2[0, 0, 1] = conv2[1, 1, 1] = 1.0
    mm1 = np.zeros((2, WIDTH * STACK), np.float32)  # a stacked group is STACK frames side by side
    for s in range(STACK):
        mm1[0, s * WIDTH] = mm1[1, s * WIDTH + 1] = 1.0 / STACK
    mm2 = np.stack([embeddings[w][:width] / lit for w, lit in zip(words, LIT)], axis=1).astype(np.float32)
    zeros = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    tensors = {
        "a.conv1d.1.weight": conv1, "a.conv1d.1.bias": zeros(WIDTH, 1),
        "a.conv1d.2.weight": conv2, "a.conv1d.2.bias": zeros(WIDTH, 1),
        "a.position_embd.weight": zeros(1500, WIDTH),
        "a.blk.0.ln1.weight": np.ones(WIDTH, np.float32), "a.blk.0.ln1.bias": zeros(WIDTH),
        "a.blk.0.ln2.weight": np.ones(WIDTH, np.float32), "a.blk.0.ln2.bias": zeros(WIDTH),
        "a.blk.0.attn_q.weight": zeros(WIDTH, WIDTH), "a.blk.0.attn_q.bias": zeros(WIDTH),
        "a.blk.0.attn_k.weight": zeros(WIDTH, WIDTH),  # Whisper's keys have no bias
        "a.blk.0.attn_v.weight": zeros(WIDTH, WIDTH), "a.blk.0.attn_v.bias": zeros(WIDTH),
        "a.blk.0.attn_out.weight": zeros(WIDTH, WIDTH), "a.blk.0.attn_out.bias": zeros(WIDTH),
        "a.blk.0.ffn_up.weight": zeros(2 * WIDTH, WIDTH), "a.blk.0.ffn_up.bias": zeros(2 * WIDTH),
        "a.blk.0.ffn_down.weight": zeros(WIDTH, 2 * WIDTH), "a.blk.0.ffn_down.bias": zeros(WIDTH),
        "mm.a.mlp.1.weight": mm1, "mm.a.mlp.2.weight": mm2,
    }
    shape = {"embedding_length": WIDTH, "feed_forward_length": 2 * WIDTH, "block_count": 1,
             "projection_dim": width, "attention.head_count": 1, "num_mel_bins": N_MEL}
    return write_clip(path, "tone projector", "voxtral", shape, tensors, modality="audio",
                      extra={"clip.audio.projector.stack_factor": STACK})


def tone_clip(hz: float, seconds: float = 29.0, rate: int = RATE, amplitude: float = 0.5) -> np.ndarray:
    """A pure tone; 29 s by default, which fills all but the last token of libmtmd's 30 s window."""
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * math.pi * hz * t)).astype(np.float32)
