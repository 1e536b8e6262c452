#!/usr/bin/env bash
# Formats the C++/CUDA sources with the repository's .clang-format, or checks them.
#
#   scripts/format.sh [--check] [FILE...]
#
# Without FILE: every tracked *.cpp, *.hpp, *.cu, *.cuh and *.h; a FILE must be one of those
# (any other is refused, not rewritten as C++). Without --check the files
# are rewritten in place. With --check nothing is written: each file clang-format would
# change is listed with the number of its lines that would change, then the totals; exit
# status 1 if any would change, 0 if none. To see the changes themselves:
#   clang-format FILE | diff FILE -
# CLANG_FORMAT names the program (default: clang-format; version 14 or newer, Debian's
# `apt-get install clang-format`).
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
files=()
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "format.sh: unknown option '$arg' (options: --check)" >&2; exit 2 ;;
    *) files+=("$arg") ;;
  esac
done
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
if ! command -v "$CLANG_FORMAT" > /dev/null; then
  echo "format.sh: $CLANG_FORMAT not found; install it (Debian: apt-get install clang-format) or set CLANG_FORMAT" >&2
  exit 2
fi
version=$("$CLANG_FORMAT" --version | sed -n 's/.*version \([0-9][0-9]*\).*/\1/p')
if [ -z "$version" ] || [ "$version" -lt 14 ]; then
  echo "format.sh: $CLANG_FORMAT is version '${version:-unknown}'; .clang-format needs 14 or newer" >&2
  exit 2
fi
style=--style=file:$PWD/.clang-format  # also for a FILE outside the tree
if ((${#files[@]} == 0)); then
  mapfile -t files < <(git ls-files -- '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h')
fi
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "format.sh: no file '$f'" >&2; exit 2; }
  case "$f" in
    *.cpp|*.hpp|*.cu|*.cuh|*.h) ;;
    # clang-format would read any other file (Python, CMake) as C++ and rewrite it
    *) echo "format.sh: '$f' is not a C++/CUDA source (*.cpp, *.hpp, *.cu, *.cuh, *.h)" >&2; exit 2 ;;
  esac
done

if ((!check)); then
  "$CLANG_FORMAT" -i "$style" "${files[@]}"
  echo "format.sh: formatted ${#files[@]} files"
  exit 0
fi
flagged=0 lines=0
for f in "${files[@]}"; do
  # Lines of the file that the formatted version replaces or drops.
  n=$("$CLANG_FORMAT" "$style" "$f" | diff "$f" - | grep -c '^<' || true)
  if ((n > 0)); then
    echo "$f: $n lines would change"
    flagged=$((flagged + 1)) lines=$((lines + n))
  fi
done
echo "format.sh --check: $flagged of ${#files[@]} files would change ($lines lines)"
((flagged == 0))
