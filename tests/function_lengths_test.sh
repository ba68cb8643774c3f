#!/usr/bin/env bash
# Checks tests/function_lengths.py on tiny C++ snippets with known answers:
# names and line counts of free functions, out-of-line and inline members,
# constructors with brace initializers, and that lambdas, raw strings, char
# literals and namespace-scope initialisers do not fool it; then --max-lines
# and --max-file-lines.
# usage: function_lengths_test.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
script="$here/function_lengths.py"
command -v python3 >/dev/null || { echo "FAIL: python3 not found"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
status=0
fail() { echo "FAIL: $*"; status=1; }

# Line numbers matter below: the expected output refers to them.
cat > a.cc <<'EOF'
#include <string>
// a comment with { brace
namespace ns {

int freeFn(int x) {
  return x + 1'000;
}

class Widget {
 public:
  Widget();
  ~Widget() {}
  int inlineGet() const {
    return a_;
  }
  int size() const;

 private:
  int a_;
  int b_;
  int c_{3};
};

Widget::Widget()
    : a_{1}, b_(2) {
  b_ += a_;
}

int Widget::size() const {
  return a_ + b_;
}

const auto kTable = [] {
  int t = 0;
  for (int i = 0; i < 3; ++i) t += i;
  return t;
}();

std::string withLambda(int n) {
  auto f = [n](int k) {
    return k * n;
  };
  const char* s = R"x(a { "b" } // c )x";
  const char* m = R"(
}}} /* not a comment
)";
  char c = '{';
  return std::string(s) + m + c + std::to_string(f(2));
}

}  // namespace ns

extern "C" {
int cFn(void) { return 0; }
}
EOF

expected='   11  a.cc:39  withLambda
    4  a.cc:24  Widget::Widget
    3  a.cc:5  freeFn
    3  a.cc:13  Widget::inlineGet
    3  a.cc:29  Widget::size
    1  a.cc:12  Widget::~Widget
    1  a.cc:54  cFn'
got=$(python3 "$script" --top 100 a.cc) || fail "listing exited $?"
if [[ "$got" != "$expected" ]]; then
  fail "listing differs"
  diff <(echo "$expected") <(echo "$got")
fi

got=$(python3 "$script" --top 2 a.cc)
[[ "$got" == "$(head -2 <<<"$expected")" ]] || fail "--top 2 gave: $got"

got=$(python3 "$script" --top 0 --max-lines 10 a.cc)
rc=$?
[[ $rc == 1 ]] || fail "--max-lines 10 exited $rc, want 1"
[[ "$got" == "FAIL: a.cc:39 withLambda is 11 lines (limit 10)" ]] ||
  fail "--max-lines 10 printed: $got"

got=$(python3 "$script" --top 0 --max-lines 11 a.cc)
rc=$?
[[ $rc == 0 ]] || fail "--max-lines 11 exited $rc, want 0"
[[ "$got" == "ok: no function over 11 lines in a.cc" ]] ||
  fail "--max-lines 11 printed: $got"

# --max-file-lines counts lines as `wc -l` does: a.cc is 55, b.cc 3.
printf 'int one() {\n  return 1;\n}\n' > b.cc
got=$(python3 "$script" --top 0 --max-file-lines 54 a.cc b.cc)
rc=$?
[[ $rc == 1 ]] || fail "--max-file-lines 54 exited $rc, want 1"
[[ "$got" == "FAIL: a.cc is 55 lines (limit 54)" ]] ||
  fail "--max-file-lines 54 printed: $got"

got=$(python3 "$script" --top 0 --max-file-lines 3 b.cc)
rc=$?
[[ $rc == 0 ]] || fail "--max-file-lines 3 exited $rc, want 0"
[[ "$got" == "ok: no file over 3 lines in b.cc" ]] ||
  fail "--max-file-lines 3 printed: $got"

got=$(python3 "$script" --top 0 --max-lines 11 --max-file-lines 55 a.cc b.cc)
rc=$?
[[ $rc == 0 ]] || fail "both limits exited $rc, want 0"
[[ "$got" == "ok: no function over 11 lines, no file over 55 lines in a.cc b.cc" ]] ||
  fail "both limits printed: $got"

[[ $status == 0 ]] && echo "ok: function_lengths.py"
exit $status
