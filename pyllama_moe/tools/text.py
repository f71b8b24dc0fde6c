"""The text the tools run models on: documentation and source code of Python's standard library, which every machine
with Python has (the routing report's and the bench's default text, and moefy's calibration text, from other modules).

Public API: :func:`stdlib_text`, :func:`prose_text`, :data:`STDLIB_MODULES`, :data:`CALIBRATION_MODULES`,
:data:`PROSE_TOPICS`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# modules whose documentation and source make the default text: broad topics, in a fixed order
STDLIB_MODULES = ("json", "re", "pathlib", "argparse", "collections", "itertools", "functools", "datetime",
                  "decimal", "fractions", "statistics", "random", "string", "textwrap", "difflib", "csv",
                  "sqlite3", "email", "http.client", "urllib.parse", "socket", "threading", "subprocess",
                  "logging", "unittest", "dataclasses", "typing", "enum", "heapq", "bisect", "zipfile",
                  "tarfile", "hashlib", "base64", "calendar", "shutil", "tempfile", "glob", "fnmatch")


# those of the calibration text of pyllama_moe.tools.moefy: none of the above
CALIBRATION_MODULES = ("os", "io", "math", "cmath", "operator", "copy", "pickle", "struct", "codecs", "locale",
                       "gettext", "configparser", "shlex", "html", "xml.dom.minidom", "ipaddress", "uuid", "secrets",
                       "time", "sched", "queue", "asyncio", "contextlib", "abc", "weakref", "inspect", "ast", "dis",
                       "pprint", "reprlib", "graphlib", "array", "mailbox", "mimetypes", "smtplib", "ftplib", "wave")

# topics of the language reference whose text is mostly prose (pydoc_data.topics, what ``help("TOPIC")`` prints)
PROSE_TOPICS = ("objects", "execmodel", "exceptions", "naming", "import")


def stdlib_text(n_chars: int = 60_000, source_share: float = 0.3, modules: Sequence[str] = STDLIB_MODULES) -> str:
    """Documentation (``pydoc``'s plain text) and source code of standard-library modules, about ``n_chars``
    characters, ``source_share`` of it code: text every machine with Python has, on many topics."""
    import importlib
    import inspect
    import pydoc

    docs, code = [], []
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        text = pydoc.render_doc(mod, renderer=pydoc.plaintext)  # type: ignore[attr-defined]  # not in typeshed
        # paths and addresses differ between machines
        text = "\n".join(ln for ln in text.splitlines() if not re.match(r"\s*(FILE|MODULE REFERENCE)\b", ln))
        docs.append(re.sub(r"0x[0-9a-f]+", "0x0", text)[:4000])
        try:
            code.append(inspect.getsource(mod)[:3000])
        except (OSError, TypeError):
            pass
    n_code = int(n_chars * source_share)
    return ("\n\n".join(docs)[: n_chars - n_code] + "\n\n" + "\n\n".join(code)[:n_code]).strip()


def prose_text(n_chars: int = 4000, topics: Sequence[str] = PROSE_TOPICS) -> str:
    """Prose of the Python language reference (``pydoc_data.topics``): the paragraphs of ``topics`` that are running
    text, each on one line (no headings, lists, grammar or examples), about ``n_chars`` characters. Text that rarely
    repeats itself word for word: what prompt-lookup decoding finds little to copy from."""
    from pydoc_data.topics import topics as reference  # type: ignore[import-not-found,import-untyped,unused-ignore]

    paragraphs = []
    for name in topics:
        for para in re.split(r"\n\s*\n", reference[name]):
            if para.startswith((" ", "*", "-")) or re.search(r"^[=*-]{3,}", para, re.M) or "\n" not in para:
                continue  # an example, a list item, a heading or a one-line label
            paragraphs.append(" ".join(ln.strip() for ln in para.splitlines()))
    return "\n\n".join(paragraphs)[:n_chars].strip()
