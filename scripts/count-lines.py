#!/usr/bin/env python3
"""Counts non-test src/ lines against issue 23's budget.

Every .rs file under src/ except tests.rs, files under a tests/ folder and
#[cfg(test)] items. Prints code lines (neither blank nor only a comment) and
all lines (comments and blanks included), in total or per file with -v.
Usage: scripts/count-lines.py [-v] [ROOT]
"""
import pathlib
import sys


def lines_of(text):
    """The lines outside #[cfg(test)] items."""
    lines = text.splitlines()
    kept, i = [], 0
    while i < len(lines):
        if lines[i].strip() != "#[cfg(test)]":
            kept.append(lines[i])
            i += 1
            continue
        # Skip the attribute and the item after it: one line ending in `;`, or
        # up to the brace that closes its body.
        i += 1
        depth, opened = 0, False
        while i < len(lines):
            line = lines[i]
            i += 1
            depth += line.count("{") - line.count("}")
            opened = opened or "{" in line
            if (opened and depth <= 0) or (not opened and line.rstrip().endswith(";")):
                break
    return kept


def is_code(line):
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("//")


def main():
    args = [a for a in sys.argv[1:] if a != "-v"]
    verbose = "-v" in sys.argv[1:]
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).parent.parent) / "src"
    code = total = 0
    for path in sorted(root.rglob("*.rs")):
        rel = path.relative_to(root)
        if path.name == "tests.rs" or "tests" in rel.parts[:-1]:
            continue
        kept = lines_of(path.read_text())
        file_code = sum(map(is_code, kept))
        code += file_code
        total += len(kept)
        if verbose:
            print(f"{file_code:6} {len(kept):6}  src/{rel}")
    print(f"non-test src/: {code} code lines, {total} with comments and blanks")


if __name__ == "__main__":
    main()
