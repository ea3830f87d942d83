#!/usr/bin/env bash
# Builds the book (docs/ -> docs/book/) and checks its links and README's: every
# relative link names a file that exists, and every #anchor an id that the target page
# has. mdbook itself checks neither, and a chapter renamed or a heading reworded would
# otherwise leave dead links. Links to other sites are not followed (CI has no
# internet). mdbook comes from crates.io when missing (a fresh machine has only the
# Rust toolchain; about 3.5 min of CPU to build). Run by .ci/run and tests/package.sh
# (the package ships the book); by hand: docs/build.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MDBOOK=0.4.52
if ! mdbook --version 2>/dev/null | grep -qx "mdbook v$MDBOOK"; then
    echo "-- cargo install --locked mdbook@$MDBOOK (only what the build needs)"
    cargo install --locked "mdbook@$MDBOOK" --no-default-features --features search
fi
rm -rf docs/book
mdbook build docs

book=docs/book
bad=0
checked=0

# check FROM TARGET: TARGET is a link as written in FROM (a path, #anchor, or both).
check() {
    local from=$1 link=$2 path frag file
    case "$link" in
        http://* | https://* | mailto:* | javascript:* | "") return ;;
    esac
    path=${link%%#*}
    frag=
    [[ "$link" == *"#"* ]] && frag=${link#*#}
    if [ -z "$path" ]; then
        file=$from
    else
        file=$(dirname "$from")/$path
    fi
    # A chapter's Markdown source stands for its page in the built book.
    if [[ "$file" == docs/src/*.md ]]; then
        file=$book/${file#docs/src/}
        file=${file%.md}.html
    fi
    checked=$((checked + 1))
    if [ ! -e "$file" ]; then
        echo "$from: $link: no such file ($file)"
        bad=$((bad + 1))
        return
    fi
    if [ -n "$frag" ] && [[ "$file" == *.html ]] && ! grep -q "id=\"$frag\"" "$file"; then
        echo "$from: $link: no id \"$frag\" in $file"
        bad=$((bad + 1))
    fi
}

for page in "$book"/*.html; do
    while IFS= read -r href; do
        check "$page" "$href"
    done < <(grep -o 'href="[^"]*"' "$page" | sed 's/^href="//; s/"$//' | sort -u)
done

# README is read on the forge and in the package: it links into the book's sources.
while IFS= read -r link; do
    case "$link" in
        "#"*) echo "README.md: $link: README links into the book, not to its own headings"; bad=$((bad + 1)) ;;
        *) check README.md "$link" ;;
    esac
done < <(grep -o '\](\([^)]*\))' README.md | sed 's/^](//; s/)$//' | sort -u)

echo "docs/build.sh: docs/book/ built; $checked links checked, $bad broken"
[ "$bad" = 0 ]
