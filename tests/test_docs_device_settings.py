"""Every doc shows the device-settings file in one format (JSON), and its examples parse as the devices read it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fedfilter.client.settings.simulated import ENV_VAR, with_device_settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "examples").glob("*/README.md")), *sorted((ROOT / "docs").glob("*.md"))]


def test_every_doc_names_a_json_settings_file():
    named = []
    for doc in DOCS:
        for match in re.finditer(rf"{ENV_VAR}=(\S+)", doc.read_text(encoding="utf-8")):
            named.append((doc.name, match.group(1)))
    assert named, "no doc shows the variable: the test reads nothing"
    assert all(value.endswith(".json") for _, value in named), named


def test_the_readmes_json_examples_are_what_a_device_reads(tmp_path):
    blocks = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        blocks += re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)
        blocks += re.findall(r"<<JSON\n(.*?)JSON\n", text, flags=re.DOTALL)
    assert len(blocks) >= 3, blocks
    for block in blocks:
        path = tmp_path / "devices.json"
        path.write_text(block.replace("$PWD", str(tmp_path)))
        table = json.loads(path.read_text())
        for pid in table:
            merged = with_device_settings({"partition-id": int(pid)}, environ={ENV_VAR: str(path)})
            assert merged["ledger-dir"] and merged["partition-id"] == int(pid)
