"""MkDocs hook: the pages whose content is generated when the site is built.

Each such page holds a marker comment, which this hook replaces with its renderer's Markdown: the
CLI reference from the real argparse parsers (``cli_reference.py``) and the Benchmarks page from
the recorded results in benchmarks/results/ (``benchmark_results.py``). MkDocs puts this folder on
the import path while it loads the hook.
"""

from __future__ import annotations

from collections.abc import Callable

import benchmark_results
import cli_reference

GENERATED: dict[str, tuple[str, Callable[[], str]]] = {
    "reference/cli.md": ("<!-- cli-reference -->", cli_reference.render),
    "benchmarks.md": ("<!-- benchmark-results -->", benchmark_results.render),
}


def on_page_markdown(markdown: str, *, page, config, files) -> str:
    """MkDocs event: fill a generated page's marker with its rendered content."""
    generated = GENERATED.get(page.file.src_uri)
    if generated is None:
        return markdown
    marker, render = generated
    if marker not in markdown:
        raise ValueError(f"{page.file.src_uri} lacks the marker {marker}")
    return markdown.replace(marker, render())
