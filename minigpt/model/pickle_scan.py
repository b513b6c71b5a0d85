"""What a refused pickle would have loaded: the classes and functions it names, read opcode by opcode with
pickletools (which parses the stream and builds nothing, so no code of the file runs).

Used for the message of a checkpoint that weights_only loading refuses: "it holds pickled Python objects
(posix.system)" says what was found, where "the file is damaged" would send the user looking for a disk fault."""

from __future__ import annotations

import pickletools
import re
import zipfile
from pathlib import Path

# what every torch.save file names: tensors are rebuilt through these (the weights_only loader allows them)
TORCH_OWN = re.compile(r"^(torch\.|collections\.OrderedDict$)")
STRING_OPCODES = ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING")


def _pickle_bytes(path: Path) -> bytes:
    """The pickle stream: the data.pkl member of torch.save's zip layout, or the whole file."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            member = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            return archive.read(member) if member else b""
    return path.read_bytes()


def pickled_globals(path: Path) -> list[str]:
    """The module.name of every class or function the pickle refers to, in order, torch's own left out; [] when
    the file cannot be read or names none (a stream damaged part-way keeps what came before the damage)."""
    try:
        data = _pickle_bytes(Path(path))
    except (OSError, zipfile.BadZipFile, KeyError):
        return []
    found, strings = [], []
    try:
        for opcode, arg, _position in pickletools.genops(data):
            if opcode.name in ("GLOBAL", "INST"):  # protocols 0-3: the argument is "module name"
                found.append(".".join(str(arg).split(" ", 1)))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:  # protocol 4+: the two strings pushed before
                found.append(f"{strings[-2]}.{strings[-1]}")
            elif opcode.name in STRING_OPCODES:
                strings.append(str(arg))
    except Exception:  # any parse error ends the scan; what was found stays
        pass
    return [name for name in dict.fromkeys(found) if not TORCH_OWN.match(name)]
