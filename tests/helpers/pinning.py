"""The files a device owner writes for peer-key pinning: each device's identity and its pinned peers."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def identity_files(tmp_path, n):
    """Each device's identity PEM, and its public key as 64 hex digits (what the owners exchange)."""
    paths, hexes = [], []
    for i in range(n):
        key = Ed25519PrivateKey.generate()
        path = tmp_path / f"identity{i}.pem"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        paths.append(str(path))
        hexes.append(raw.hex())
    return paths, hexes


def pin(tmp_path, i, hexes) -> str:
    path = tmp_path / f"pinned{i}.txt"
    path.write_text("# the federation's devices\n" + "\n".join(hexes) + "\n")
    return str(path)
