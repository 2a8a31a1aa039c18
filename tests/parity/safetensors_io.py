"""A hand-written safetensors reader and writer (Debian has no python3-safetensors):
8-byte little-endian header length, JSON header, raw little-endian data."""
import json
import struct

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
          torch.uint8: "U8", torch.bool: "BOOL"}
CODES = {v: k for k, v in DTYPES.items()}


def save(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = CODES[info["dtype"]]
        buf = bytearray(data[begin:end])
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dtype).reshape(info["shape"]).clone()
    return out, header.get("__metadata__", {})


def run_lua(exe, script, *args):
    """Runs a parity script beside this file with anatomy on one thread;
    returns True, or prints its output and the failing summary line and
    returns False."""
    import os
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, script), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr)
        print("0 passed, 1 failed")
        return False
    return True
