#!/usr/bin/env python3
"""Prints the structural measures of non-test src/ (issue 33), and with --check fails when
one is over its target.

Non-test code is every .rs file under src/ except tests.rs, files under a tests/ folder and
#[cfg(test)] items. The measures:

  circles     import circles between files: groups of files that import each other round
              (a folder's mod.rs and the files directly in that folder count as one module,
              so their imports of each other are not edges);
  upward      imports from a lower top-level module to a higher one, in LAYERS order;
  big files   files over 400 code lines (neither blank nor only a comment);
  long fns    functions over 60 code lines;
  sql         files containing an SQL statement (a string literal that begins with one);
  config      places naming the whole `Config` below commands/ and config/ (every mention of
              the type in code, `use` lines and comments aside);
  refusals    refusals built outside unit-tested code: a refusal (START_REFUSALS, or
              CommandError::Refused) built in a function no unit test calls by name.

Usage: scripts/structure.py [-v] [--check] [ROOT]
"""
import collections
import pathlib
import re
import sys

# Lowest first: a module may import only modules before it (and itself).
LAYERS = [
    "lsn",
    "remedy",
    "pgoutput",
    "outbox",
    "observability",
    "cloud",
    "config",
    "postgres",
    "sink",
    "startup",
    "source",
    "pipeline",
    "commands",
]

TARGETS = {
    "circles": 0,
    "upward": 0,
    "big files": 3,
    "long fns": 5,
    "sql": 6,
    "config": 8,
    "refusals": 0,
}

BIG_FILE = 400

MOD_DECLARATION = r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;"
USE_STATEMENT = r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);"
INLINE_PATH = r"(?<![\w:])((?:crate|super|self|outbox_relay|[a-z_][a-z0-9_]*)(?:::\w+)+)"
LONG_FN = 60

SQL_START = re.compile(
    r"^\s*(SELECT|WITH|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|SET|SHOW|START_REPLICATION|"
    r"ALTER_REPLICATION_SLOT|IDENTIFY_SYSTEM)\b"
)

# How a refusal is built: start-up's checks, the Postgres side's misconfiguration, a
# subcommand's refusal.
REFUSALS = re.compile(
    r"\b(Refused::\w+|SourceError::Misconfigured|SourceError::SlotLost|CommandError::Refused)\b"
)


class Source:
    """One .rs file: its text with comments blanked (`code`), with strings blanked too
    (`bare`), its string literals, and the ranges of its #[cfg(test)] items."""

    def __init__(self, path, rel):
        self.path = path
        self.rel = rel
        text = path.read_text()
        self.code, self.bare, self.strings = mask(text)
        self.tests = test_ranges(self.bare)

    def in_test(self, pos):
        return any(start <= pos < end for start, end in self.tests)

    def line_of(self, pos):
        return self.code.count("\n", 0, pos)

    def code_lines(self, start=0, end=None):
        """Code lines in [start, end): neither blank nor only a comment, tests aside."""
        end = len(self.code) if end is None else end
        count, pos = 0, start
        for line in self.code[start:end].split("\n"):
            if line.strip() and not self.in_test(pos):
                count += 1
            pos += len(line) + 1
        return count


def mask(text):
    """(text with comments blanked, text with comments and string contents blanked,
    [(position, literal contents)]); newlines are kept, so positions and lines agree."""
    code, bare, strings = [], [], []
    i, n = 0, len(text)

    def blank(chunk):
        return "".join(c if c == "\n" else " " for c in chunk)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            code.append(blank(text[i:end]))
            bare.append(blank(text[i:end]))
            i = end
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            code.append(blank(text[i:j]))
            bare.append(blank(text[i:j]))
            i = j
        elif re.match(r'(b?r#*")', text[i:i + 260]) and not is_ident_char(text, i - 1):
            opener = re.match(r'b?r(#*)"', text[i:]).group(0)
            hashes = opener.count("#")
            closer = '"' + "#" * hashes
            end = text.find(closer, i + len(opener))
            end = n if end < 0 else end + len(closer)
            literal = text[i:end]
            code.append(literal)
            bare.append(opener + blank(literal[len(opener):-len(closer)]) + closer)
            strings.append((i, literal[len(opener):-len(closer)]))
            i = end
        elif c == '"' or (c == "b" and text.startswith('b"', i) and not is_ident_char(text, i - 1)):
            start = i + (2 if c == "b" else 1)
            j = start
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            literal = text[i:j + 1]
            code.append(literal)
            bare.append(text[i:start] + blank(text[start:j]) + '"')
            strings.append((i, text[start:j]))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}', '"'), or a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                code.append(m.group(0))
                bare.append("' '" if len(m.group(0)) == 3 else blank(m.group(0)))
                i += len(m.group(0))
            else:
                code.append(c)
                bare.append(c)
                i += 1
        else:
            code.append(c)
            bare.append(c)
            i += 1
    return "".join(code), "".join(bare), strings


def is_ident_char(text, i):
    return i >= 0 and (text[i].isalnum() or text[i] == "_")


def matching_brace(bare, open_at):
    depth = 0
    for j in range(open_at, len(bare)):
        if bare[j] == "{":
            depth += 1
        elif bare[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(bare) - 1


def item_end(bare, start):
    """Where the item starting at `start` ends: after its `;`, or its body's closing brace."""
    for j in range(start, len(bare)):
        if bare[j] == ";":
            return j + 1
        if bare[j] == "{":
            return matching_brace(bare, j) + 1
    return len(bare)


def test_ranges(bare):
    ranges = []
    for m in re.finditer(r"#\[cfg\(test\)\]", bare):
        ranges.append((m.start(), item_end(bare, m.end())))
    return ranges


def functions(src):
    """(name, start, end) of each non-test fn with a body."""
    found = []
    for m in re.finditer(r"\bfn\s+(\w+)", src.bare):
        if src.in_test(m.start()):
            continue
        j = m.end()
        # The body's brace, or a `;` (a declaration without one).
        depth = 0
        while j < len(src.bare):
            ch = src.bare[j]
            if ch in "(<[":
                depth += 1
            elif ch in ")>]" and not src.bare.startswith("->", j - 1):
                depth -= 1
            elif ch == ";" and depth <= 0:
                j = -1
                break
            elif ch == "{" and depth <= 0:
                break
            j += 1
        if j < 0 or j >= len(src.bare):
            continue
        line_start = src.bare.rfind("\n", 0, m.start()) + 1
        found.append((m.group(1), line_start, matching_brace(src.bare, j) + 1))
    return found


def module_of(rel):
    """The module path of a file: src/source/setup.rs -> ["source", "setup"]."""
    parts = list(rel.parts)
    if parts[-1] in ("mod.rs", "lib.rs", "main.rs"):
        return parts[:-1]
    return parts[:-1] + [parts[-1][:-3]]


def use_paths(statement):
    """The full paths a `use` tree names: `a::{b, c::{d, self}}` -> a::b, a::c::d, a::c."""
    statement = re.sub(r"\s+as\s+\w+", "", statement)
    statement = re.sub(r"\s+", "", statement)

    def expand(prefix, tree):
        if not tree:
            return [prefix]
        if tree.startswith("{"):
            inner, out, depth, part = tree[1:-1], [], 0, ""
            for ch in inner + ",":
                if ch == "," and depth == 0:
                    if part:
                        out.extend(expand(prefix, part))
                    part = ""
                    continue
                depth += ch == "{"
                depth -= ch == "}"
                part += ch
            return out
        head, sep, rest = tree.partition("::")
        if head == "self":
            return [prefix]
        path = prefix + [head]
        return expand(path, rest) if sep else [path]

    return expand([], statement)


class Crate:
    def __init__(self, root):
        self.root = root
        self.sources = {}
        for path in sorted((root / "src").rglob("*.rs")):
            rel = path.relative_to(root / "src")
            if path.name == "tests.rs" or "tests" in rel.parts[:-1]:
                continue
            self.sources[rel] = Source(path, rel)
        self.modules = {tuple(module_of(rel)): rel for rel in self.sources if rel.name != "main.rs"}
        self.test_text = self._test_text()

    def _test_text(self):
        """Unit-test code, by where it tests: a file's #[cfg(test)] items test that file, a
        tests.rs (or a tests/ folder) its folder and the folders below."""
        by_file = collections.defaultdict(list)
        by_folder = collections.defaultdict(list)
        for path in sorted((self.root / "src").rglob("*.rs")):
            rel = path.relative_to(self.root / "src")
            if path.name == "tests.rs" or "tests" in rel.parts[:-1]:
                folder = rel.parent.parent if "tests" in rel.parts[:-1] else rel.parent
                if path.name == "tests.rs" and rel.parent.name != "tests" and \
                        (self.root / "src" / rel.parent.with_suffix(".rs")).exists():
                    # foo/tests.rs of foo.rs (`mod tests;` in foo.rs) tests foo.rs.
                    by_file[rel.parent.with_suffix(".rs")].append(mask(path.read_text())[1])
                    continue
                by_folder[folder].append(mask(path.read_text())[1])
        for rel, src in self.sources.items():
            by_file[rel].extend(src.bare[start:end] for start, end in src.tests)
        return by_file, by_folder

    def exercised(self):
        """The functions unit tests run, as (file, name): those a test calls (in the file it
        tests, preferring the test's own file), and those a function they run calls (in its
        own file, else anywhere in its top-level module)."""
        fns = collections.defaultdict(list)
        for rel, src in self.sources.items():
            for name, start, end in functions(src):
                fns[name].append((rel, src.bare[start:end]))
        call = re.compile(r"\b(\w+)\s*(?:::<[^>]*>)?\(")

        def targets(text, here, scope):
            found = set()
            for name in set(call.findall(text)) & fns.keys():
                own = [rel for rel, _ in fns[name] if rel == here]
                wider = [rel for rel, _ in fns[name] if scope(rel)]
                found.update((rel, name) for rel in (own or wider))
            return found

        by_file, by_folder = self.test_text
        reached = set()
        for rel, texts in by_file.items():
            for text in texts:
                reached |= targets(text, rel, lambda r: top(r) == top(rel))
        for folder, texts in by_folder.items():
            inside = lambda r, folder=folder: folder in r.parents or r.parent == folder
            for text in texts:
                reached |= targets(text, None, inside)
        todo = list(reached)
        while todo:
            rel, name = todo.pop()
            for body_rel, body in fns[name]:
                if body_rel != rel:
                    continue
                for node in targets(body, rel, lambda r: top(r) == top(rel)) - reached:
                    reached.add(node)
                    todo.append(node)
        return reached

    def resolve(self, path):
        """The file holding the item at the absolute module path `path`."""
        for length in range(len(path), -1, -1):
            rel = self.modules.get(tuple(path[:length]))
            if rel is not None:
                return rel
        return None

    def imports(self, src):
        """The files `src` names items of, each with the lines where."""
        here = module_of(src.rel)
        children = set(re.findall(MOD_DECLARATION, src.bare, re.M))
        aliases = {}
        paths = []

        def absolute(path):
            head = path[0]
            if head in ("crate", "outbox_relay"):
                return path[1:]
            if head == "self":
                return here + path[1:]
            if head == "super":
                base, rest = here, path
                while rest and rest[0] == "super":
                    base, rest = base[:-1], rest[1:]
                return base + rest
            if head in children:
                return here + path
            if head in aliases:
                return aliases[head] + path[1:]
            return None  # another crate

        for m in re.finditer(USE_STATEMENT, src.bare, re.M):
            if src.in_test(m.start()):
                continue
            for path in use_paths(m.group(1)):
                full = absolute(path) if path else None
                if full is None:
                    continue
                paths.append((full, m.start()))
                if tuple(full) in self.modules:
                    aliases[full[-1]] = full
        for m in re.finditer(INLINE_PATH, src.bare):
            if src.in_test(m.start()) or in_use_statement(src.bare, m.start()):
                continue
            full = absolute(m.group(1).split("::"))
            if full is not None:
                paths.append((full, m.start()))
        found = collections.defaultdict(list)
        for full, pos in paths:
            target = self.resolve(full)
            if target is not None and target != src.rel:
                found[target].append(src.line_of(pos) + 1)
        return found


def in_use_statement(bare, pos):
    """Whether `pos` is inside a `use` statement (already counted as one)."""
    start = max(bare.rfind(";", 0, pos), bare.rfind("}", 0, pos), bare.rfind("{", 0, pos))
    return re.match(r"\s*(pub(\([^)]*\))?\s+)?use\s", bare[start + 1:pos]) is not None


def builds_text(bare, end):
    """Whether the refusal at `end` composes its text there (a literal, `format!`, or a struct
    with fields), rather than converting one built elsewhere."""
    rest = bare[end:end + 200].lstrip()
    if rest.startswith("{"):
        return not rest[1:].lstrip().startswith("..")
    if not rest.startswith("("):
        return False
    argument = rest[1:].lstrip()
    return argument.startswith(('"', "format!", "concat!"))


def is_pattern(bare, end):
    """Whether the path ending at `end` is matched on (`Err(X(e)) =>`), not built."""
    j = end
    while j < len(bare) and bare[j] in " \n":
        j += 1
    if j < len(bare) and bare[j] in "({":
        j = matching_group(bare, j) + 1
    rest = bare[j:j + 40].lstrip(") \n")
    return rest.startswith(("=>", "|", "if "))


def matching_group(bare, open_at):
    pairs = {"(": ")", "{": "}"}
    opener, closer, depth = bare[open_at], pairs[bare[open_at]], 0
    for j in range(open_at, len(bare)):
        depth += bare[j] == opener
        depth -= bare[j] == closer
        if depth == 0:
            return j
    return len(bare) - 1


def one_module(a, b):
    """Whether files a and b are a folder's mod.rs (or the foo.rs beside a foo/ folder, Rust's
    other spelling of foo/mod.rs) and a file directly in that folder."""
    for x, y in ((a, b), (b, a)):
        if x.name == "mod.rs" and y.parent == x.parent:
            return True
        if x.suffix == ".rs" and y.parent == x.with_suffix(""):
            return True
        if x.name == "mod.rs" and y.name == "mod.rs" and y.parent.parent == x.parent:
            return True
        if x.name == "lib.rs":
            return True
    return False


def circles(graph):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def top(rel):
    return rel.parts[0][:-3] if len(rel.parts) == 1 else rel.parts[0]


def measure(root):
    crate = Crate(root)
    results = {}

    graph, edges = collections.defaultdict(set), {}
    for rel, src in crate.sources.items():
        for target, lines in crate.imports(src).items():
            if rel.name == "main.rs" or one_module(rel, target):
                continue
            graph[rel].add(target)
            edges[(rel, target)] = lines
    results["circles"] = [
        " -> ".join(f"src/{f}" for f in group) for group in circles(graph)
    ]

    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for (a, b), lines in sorted(edges.items()):
        ta, tb = top(a), top(b)
        if ta in rank and tb in rank and rank[ta] < rank[tb]:
            upward.append(f"src/{a}:{lines[0]} imports src/{b} ({ta} is below {tb})")
    unplaced = sorted({top(r) for r in crate.sources} - set(rank) - {"lib", "main"})
    upward.extend(f"src/{name}: not in LAYERS (scripts/structure.py)" for name in unplaced)
    results["upward"] = upward

    results["big files"] = [
        f"src/{rel}: {src.code_lines()} code lines"
        for rel, src in crate.sources.items()
        if src.code_lines() > BIG_FILE
    ]

    long_fns, refusals = [], []
    exercised = crate.exercised()
    for rel, src in crate.sources.items():
        fns = functions(src)
        for name, start, end in fns:
            lines = src.code_lines(start, end)
            if lines > LONG_FN:
                long_fns.append(f"src/{rel}:{src.line_of(start) + 1} fn {name}: {lines} code lines")
        for m in REFUSALS.finditer(src.bare):
            if src.in_test(m.start()) or is_pattern(src.bare, m.end()):
                continue
            if not builds_text(src.bare, m.end()):
                continue  # converts a refusal built elsewhere
            enclosing = [f for f in fns if f[1] <= m.start() < f[2]]
            name = min(enclosing, key=lambda f: f[2] - f[1])[0] if enclosing else None
            if (rel, name) not in exercised:
                where = f"fn {name}" if name else "outside a function"
                refusals.append(f"src/{rel}:{src.line_of(m.start()) + 1} {m.group(1)} in {where}")
    results["long fns"] = long_fns
    results["refusals"] = refusals

    results["sql"] = [
        f"src/{rel}"
        for rel, src in crate.sources.items()
        if any(SQL_START.match(s) and not src.in_test(p) for p, s in src.strings)
    ]

    config = []
    for rel, src in crate.sources.items():
        if rel.parts[0] in ("commands", "config") or len(rel.parts) == 1:
            continue
        for m in re.finditer(r"(?<![\w:])Config\b|\bconfig::Config\b", src.bare):
            line_start = src.bare.rfind("\n", 0, m.start()) + 1
            line = src.bare[line_start:src.bare.find("\n", m.start())]
            if src.in_test(m.start()) or re.match(r"\s*(pub(\([^)]*\))?\s+)?use\b", line):
                continue
            config.append(f"src/{rel}:{src.line_of(m.start()) + 1}")
    results["config"] = config
    return results


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    verbose = "-v" in sys.argv[1:]
    check = "--check" in sys.argv[1:]
    root = pathlib.Path(args[0]) if args else pathlib.Path(__file__).resolve().parent.parent
    results = measure(root)
    over = []
    for name, target in TARGETS.items():
        found = results[name]
        mark = "" if len(found) <= target else "  OVER"
        print(f"{name:10} {len(found):4}  (target: at most {target}){mark}")
        if verbose or mark:
            for item in found:
                print(f"             {item}")
        if mark:
            over.append(name)
    if check and over:
        print(f"error: over target: {', '.join(over)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
