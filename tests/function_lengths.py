#!/usr/bin/env python3
"""Length in lines of every function definition in C++ source files.

usage: function_lengths.py [--top N] [--max-lines L] [--max-file-lines F] FILE...

Prints, per file, the N longest functions (default 10) as
`LINES  file:line  name`. A function's length runs from the line of its name
to the line of its closing brace, both included (a one-line function is 1).
Lambdas and local classes count inside their enclosing function; namespace- or
class-scope initialisers (`const auto x = [] {...}();`, `T v{...};`) are not
functions. With --max-lines L, prints `FAIL: file:line name is X lines (limit
L)` for each longer function and exits 1, else ends with `ok: ...`, exit 0.
With --max-file-lines F, likewise prints `FAIL: file is X lines (limit F)` for
each file of more than F lines (newline-terminated lines, as `wc -l` counts)
and exits 1; the `ok: ...` line then names both limits.

No libclang: a small heuristic parser (comments, literals and preprocessor
lines blanked, then brace-depth tracking over tokens). Known limits: braces
inside #if branches must balance on their own, since every branch is read;
macros that expand to scopes or bodies are not seen.
"""
import argparse
import re
import sys

RAW_PREFIXES = {"R", "u8R", "uR", "UR", "LR"}


def strip(src):
    """Blank comments, string/char literals and preprocessor lines.

    Newlines are kept so line numbers stay right; a literal becomes `""` or
    `''` so `extern "C"` still reads as `extern ""`.
    """
    out, i, n = [], 0, len(src)
    line_start = True  # only blanks seen since the last newline
    while i < n:
        c = src[i]
        two = src[i:i + 2]
        if c == "\n":
            out.append(c)
            line_start = True
            i += 1
            continue
        if line_start and c == "#":
            # Directive, with backslash-continued lines.
            while i < n and src[i] != "\n":
                if src[i] == "\\" and src[i + 1:i + 2] == "\n":
                    out.append("\n")
                    i += 1
                i += 1
            continue
        if not c.isspace():
            line_start = False
        if two == "//":
            while i < n and src[i] != "\n":
                i += 1
        elif two == "/*":
            end = src.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", src[i:end]))
            i = end
        elif c == '"':
            if re.search(r"\w*$", src[max(0, i - 8):i]).group(0) in RAW_PREFIXES:
                # R"delim( ... )delim": no escapes, ends at `)delim"`.
                paren = src.index("(", i)
                close = ")" + src[i + 1:paren] + '"'
                end = src.find(close, paren)
                end = n if end < 0 else end + len(close)
            else:
                end = i + 1
                while end < n and src[end] not in '"\n':
                    end += 2 if src[end] == "\\" else 1
                end += 1
            out.append('"' + "\n" * src.count("\n", i, end) + '"')
            i = end
        elif c == "'":
            # A digit separator (1'000) follows a number token, a char
            # literal (u8'x', L'x') follows nothing or a letter prefix.
            tok = re.search(r"[A-Za-z0-9_.']*$", src[max(0, i - 40):i])
            if tok.group(0)[:1].isdigit():
                i += 1
                continue
            end = i + 1
            while end < n and src[end] not in "'\n":
                end += 2 if src[end] == "\\" else 1
            out.append("''")
            i = end + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


TOKEN = re.compile(r"""[A-Za-z_0-9]\w*|""|''|::|->|\.\.\.|&&|\|\||[=!<>+\-*/%&|^]=|\+\+|--|\S""")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "decltype",
            "alignas", "alignof", "noexcept", "throw", "catch", "static_assert",
            "requires", "void", "int", "char", "bool", "double", "float",
            "long", "short", "unsigned", "signed", "auto"}
TAIL_WORDS = {"const", "volatile", "noexcept", "override", "final", "&", "&&",
              "throw", "mutable", "try"}
CLASS_WORDS = {"class", "struct", "union"}
OPEN = {"(": ")", "[": "]", "{": "}"}


class Tok:
    def __init__(self, text, line, end_line=None):
        self.text, self.line = text, line
        self.end_line = line if end_line is None else end_line

    def __repr__(self):
        return self.text


def tokenize(text):
    toks, line, pos = [], 1, 0
    for m in TOKEN.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        toks.append(Tok(m.group(0), line))
    return toks


def match(toks, i):
    """Index of the bracket closing toks[i]; all three kinds nest together."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if t in OPEN:
            depth += 1
        elif t in ")]}":
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def func_name(h, p):
    """(name, line) of the function whose parameter group is h[p], or None."""
    k = p - 1
    if k < 0:
        return None
    # operator forms: `operator()`, `operator==`, `operator bool`.
    for j in range(k, max(-1, k - 5), -1):
        if h[j].text == "operator":
            rest = [t.text for t in h[j + 1:p]]
            sep = " " if rest and rest[0][0].isalpha() else ""
            parts, k = ["operator" + sep + "".join(rest)], j
            break
    else:
        t = h[k].text
        if not (t[0].isalpha() or t[0] == "_") or t in KEYWORDS:
            return None
        parts = [t]
        if k > 0 and h[k - 1].text == "~":
            k -= 1
            parts.insert(0, "~")
    # Qualifiers: `A::B<T>::name`.
    while k >= 2 and h[k - 1].text == "::":
        j = k - 2
        if h[j].text == ">":  # skip template arguments backwards
            depth = 0
            while j >= 0:
                depth += {">": 1, "<": -1}.get(h[j].text, 0)
                if depth == 0:
                    break
                j -= 1
            j -= 1
        if j < 0 or not (h[j].text[0].isalpha() or h[j].text[0] == "_"):
            break
        parts[:0] = [t.text for t in h[j:k]]
        k = j
    if any(t.text == "=" for t in h[:k]):  # `auto f = g(...)`: initialiser
        return None
    return "".join(parts), h[k].line


def declarator(h):
    """Classify a head ending just before `{` that may belong to a function.

    Returns ("func", name, line) when the `{` opens a body, ("init",) when it
    is a brace in a constructor's initializer list (`: a_{1}`), else None.
    h holds tokens with (), [] and init-list {} groups folded to one token.
    """
    for p, g in enumerate(h):
        if g.text != "()":
            continue
        named = func_name(h, p)
        if named is None:
            continue
        i = p + 1
        while i < len(h):  # const, noexcept(...), -> type, [[attr]] ...
            t = h[i].text
            if t in TAIL_WORDS or t == "[]" or \
                    t == "()" and h[i - 1].text in ("noexcept", "throw"):
                i += 1
            elif t == "->":
                i += 1
                while i < len(h) and h[i].text != ":":
                    i += 1
            else:
                break
        if i == len(h):
            return ("func",) + named
        if h[i].text != ":":
            continue
        # Initializer list: `name(...)` or `name{...}` items, comma separated.
        i += 1
        while i < len(h):
            j = i
            while j < len(h) and h[j].text not in ("()", "{}", ","):
                j += 1
            if j == len(h):  # a member name waiting for its `{`
                return ("init",) if j > i else None
            if h[j].text == "," or j == i:
                break
            i = j + 1
            if i < len(h) and h[i].text == "...":
                i += 1
            if i == len(h):
                return ("func",) + named
            if h[i].text != ",":
                break
            i += 1
    return None


def classify(h):
    """What a `{` at namespace/class scope opens, given the head before it."""
    words = [t.text for t in h]
    # Drop `template <...>` prefixes and attributes.
    while words and words[0] in ("template", "[]"):
        if words[0] == "[]":
            words, h = words[1:], h[1:]
            continue
        j, depth = 1, 0
        while j < len(words):
            depth += {"<": 1, ">": -1}.get(words[j], 0)
            j += 1
            if depth <= 0:
                break
        words, h = words[j:], h[j:]
    if words[:1] == ["namespace"] or words[:2] == ["inline", "namespace"]:
        return ("scope", None)
    if words == ["extern", '""']:
        return ("scope", None)
    d = declarator(h)
    if d:
        return d
    if words[:1] and words[0] in CLASS_WORDS and "=" not in words:
        rest = [w for w in words[1:] if w not in ("[]", "()", "alignas")]
        name = ""  # `struct Outer::Inner` keeps its qualifier
        while rest and (rest[0] == "::" or rest[0][0].isalpha() or rest[0][0] == "_") \
                and rest[0] not in ("final", ":"):
            name, rest = name + rest[0], rest[1:]
        return ("scope", name or "<anon>")
    return ("other",)


def scan(toks, i, classes, found):
    """Scan one namespace/class scope from toks[i]; return index past its `}`."""
    h = []
    while i < len(toks):
        t = toks[i].text
        if t in "([":
            j = match(toks, i)
            h.append(Tok(t + OPEN[t], toks[i].line, toks[j].line))
            i = j + 1
        elif t == ";":
            h, i = [], i + 1
        elif t == "}":
            return i + 1
        elif t == ":" and len(h) == 1 and h[0].text in ("public", "private", "protected"):
            h, i = [], i + 1
        elif t == "{":
            kind = classify(h)
            if kind[0] == "func":
                j = match(toks, i)
                # A function-try-block's handlers belong to the function.
                while toks[j + 1:j + 2] and toks[j + 1].text == "catch":
                    j = match(toks, match(toks, j + 2) + 1)
                name = "::".join(classes + [kind[1]])
                found.append((toks[j].line - kind[2] + 1, kind[2], name))
                h, i = [], j + 1
            elif kind[0] == "scope":
                inner = classes + [kind[1]] if kind[1] else classes
                i = scan(toks, i + 1, inner, found)
                h = []  # `struct S {...} s;` still ends at its `;`
            else:  # init-list brace or an initialiser: fold it into the head
                j = match(toks, i)
                h.append(Tok("{}", toks[i].line, toks[j].line))
                i = j + 1
        else:
            h.append(toks[i])
            i += 1
    return i


def functions(path):
    """[(lines, line, name)] for every function defined in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        toks = tokenize(strip(f.read()))
    found, i = [], 0
    while i < len(toks):  # a stray `}` at file scope must not end the scan
        i = scan(toks, i, [], found)
    return found


def file_lines(path):
    """Newline-terminated lines in path, as `wc -l` counts them."""
    with open(path, "rb") as f:
        return f.read().count(b"\n")


def ok_line(args):
    limits = []
    if args.max_lines is not None:
        limits.append(f"no function over {args.max_lines} lines")
    if args.max_file_lines is not None:
        limits.append(f"no file over {args.max_file_lines} lines")
    return f"ok: {', '.join(limits)} in {' '.join(args.files)}"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--max-lines", type=int)
    ap.add_argument("--max-file-lines", type=int)
    ap.add_argument("files", nargs="+", metavar="FILE")
    args = ap.parse_args(argv)
    fails, file_fails = [], []
    for path in args.files:
        found = sorted(functions(path), key=lambda f: (-f[0], f[1]))
        for n, line, name in found[:args.top]:
            print(f"{n:5d}  {path}:{line}  {name}")
        if args.max_lines is not None:
            fails += [(path, line, name, n) for n, line, name in found
                      if n > args.max_lines]
        if args.max_file_lines is not None:
            n = file_lines(path)
            if n > args.max_file_lines:
                file_fails.append((path, n))
    if args.max_lines is None and args.max_file_lines is None:
        return 0
    for path, line, name, n in sorted(fails):
        print(f"FAIL: {path}:{line} {name} is {n} lines (limit {args.max_lines})")
    for path, n in file_fails:
        print(f"FAIL: {path} is {n} lines (limit {args.max_file_lines})")
    if fails or file_fails:
        return 1
    print(ok_line(args))
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
