#!/usr/bin/env bash
# The README is the front door and docs/ holds the depth; this keeps them honest.
# Fails when:
#   - README.md has more than 250 lines;
#   - a relative markdown link in README.md or docs/*.md points to a missing file;
#   - an anchor (`#x` in the same file, or `file.md#x`) matches no heading there
#     (GitHub's slugs: lowercase, punctuation other than `-` and `_` dropped,
#     spaces to `-`, a repeated heading gets `-1`, `-2`, ...);
#   - a docs/*.md file is not linked from README.md;
#   - the `<!-- quickstart-command -->` or `<!-- test-command -->` marker is not
#     followed by a ```sh block of exactly one command line (.ci/run and
#     tests/cluster/package_lists.sh read those blocks).
# usage: docs_check.sh REPO_ROOT
set -u
root=${1:?usage: docs_check.sh REPO_ROOT}
command -v python3 >/dev/null || { echo "FAIL: python3 not found (Debian: apt-get install python3)"; exit 1; }

python3 - "$root" <<'EOF'
import os, re, sys

root = os.path.abspath(sys.argv[1])
readme = os.path.join(root, "README.md")
docs_dir = os.path.join(root, "docs")
max_readme_lines = 250
problems = []

def rel(path):
    return os.path.relpath(path, root)

def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()

def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if fence is None:
            yield n, line

def slug(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)                       # HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)                      # punctuation, but - and _
    return text.replace(" ", "-")

anchor_cache = {}
def anchors(path):
    if path not in anchor_cache:
        seen, out = {}, set()
        for _, line in prose_lines(read(path)):
            m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            base = slug(m.group(1))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
        anchor_cache[path] = out
    return anchor_cache[path]

link_re = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")

def links(path):
    """(line number, target) of every inline link outside code."""
    for n, line in prose_lines(read(path)):
        line = re.sub(r"(`+)(?:(?!\1).)*?\1", "", line)  # inline code spans
        for m in link_re.finditer(line):
            yield n, m.group(2)

# The README's length.
with open(readme, encoding="utf-8") as f:
    n_lines = sum(1 for _ in f)
if n_lines > max_readme_lines:
    problems.append(f"README.md: {n_lines} lines, more than {max_readme_lines}; move the depth to docs/")

# Links and anchors.
doc_files = sorted(os.path.join(docs_dir, f) for f in os.listdir(docs_dir) if f.endswith(".md")) \
    if os.path.isdir(docs_dir) else []
linked_from_readme = set()
checked = 0
for path in [readme] + doc_files:
    for n, target in links(path):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue  # http:, https:, mailto: ...
        checked += 1
        where = f"{rel(path)}:{n}: link '{target}'"
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            problems.append(f"{where}: no file {rel(dest)}")
            continue
        if path == readme:
            linked_from_readme.add(dest)
        if anchor and dest.endswith(".md") and os.path.isfile(dest):
            if anchor not in anchors(dest):
                problems.append(f"{where}: no heading in {rel(dest)} has the anchor '#{anchor}'")

for d in doc_files:
    if d not in linked_from_readme:
        problems.append(f"{rel(d)}: not linked from README.md")

# The command blocks CI reads.
lines = read(readme).split("\n")
for marker in ("quickstart-command", "test-command"):
    tag = f"<!-- {marker} -->"
    if tag not in lines:
        problems.append(f"README.md: no line '{tag}'")
        continue
    i = lines.index(tag) + 1
    if i >= len(lines) or lines[i] != "```sh":
        problems.append(f"README.md:{i + 1}: '{tag}' must be followed by a ```sh block")
        continue
    body = []
    for line in lines[i + 1:]:
        if line.startswith("```"):
            break
        body.append(line)
    else:
        problems.append(f"README.md:{i + 1}: the ```sh block after '{tag}' is not closed")
        continue
    if len([b for b in body if b.strip()]) != 1 or len(body) != 1:
        problems.append(f"README.md:{i + 1}: the block after '{tag}' must be one command line, has {len(body)}")

print(f"README.md: {n_lines} lines; {len(doc_files)} docs files; {checked} relative links checked")
for p in problems:
    print("FAIL: " + p)
if problems:
    sys.exit(1)
print("ok: links, anchors and command blocks")
EOF
