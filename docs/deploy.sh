#!/usr/bin/env bash
# Publish a built site to a branch of a remote: deploy.sh SITE_DIR REMOTE BRANCH.
#
# The branch is staged in a temporary git worktree (WORKTREE, default a fresh path under
# $TMPDIR), so the caller's checkout, index and branch are never touched. Its content is
# replaced by the site; a commit is made and pushed only when that changed the tree, so
# an unchanged site leaves the remote branch exactly as it was. A branch the remote
# lacks starts as an orphan (no history shared with the code). The worktree is removed
# on every exit path, failures included.
#
# REMOTE is a remote's name, a URL, or a path; a relative path is taken from the
# directory this script runs in, like SITE_DIR (docs/ under `make -C docs deploy`).
set -euo pipefail

site=${1:?usage: deploy.sh SITE_DIR REMOTE BRANCH}
remote=${2:?usage: deploy.sh SITE_DIR REMOTE BRANCH}
branch=${3:?usage: deploy.sh SITE_DIR REMOTE BRANCH}

[ -f "$site/index.html" ] || { echo "deploy: $site/index.html is missing; build the site first (make -C docs build)" >&2; exit 1; }
site=$(cd "$site" && pwd)
repo=$(git rev-parse --show-toplevel)
# Make a relative path absolute once: git reads it against the directory of each command,
# and a relative path would otherwise name one place here and another from the worktree.
if ! git -C "$repo" remote get-url "$remote" >/dev/null 2>&1 \
        && [[ "$remote" != /* && "$remote" != *://* && ! "$remote" =~ ^[^/]+: ]]; then
    remote="$PWD/$remote"
fi
worktree=${WORKTREE:-${TMPDIR:-/tmp}/tfcoord-docs-deploy-$branch}
if [ -e "$worktree" ]; then
    # Another deploy may be running there, or one was killed before it could clean up:
    # either way the directory is not ours to delete.
    echo "deploy: $worktree already exists; another deploy may be running. If none is, remove it" \
         "(git -C $repo worktree remove --force $worktree) and retry." >&2
    exit 1
fi

orphan="tfcoord-docs-deploy-$$"
cleanup() {
    git -C "$repo" worktree remove --force "$worktree" 2>/dev/null || rm -rf "$worktree"
    git -C "$repo" worktree prune
    git -C "$repo" branch -D "$orphan" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# ls-remote exits 2 when the remote answers but lacks the branch; any other failure
# (remote unreachable) stops here instead of starting an orphan history by mistake.
found=0
git -C "$repo" ls-remote --exit-code --heads "$remote" "refs/heads/$branch" >/dev/null || found=$?
if [ "$found" -eq 0 ]; then
    git -C "$repo" fetch --quiet "$remote" "refs/heads/$branch"
    git -C "$repo" worktree add --quiet --detach "$worktree" FETCH_HEAD
elif [ "$found" -eq 2 ]; then
    echo "deploy: $remote has no branch $branch; starting it as an orphan"
    git -C "$repo" worktree add --quiet --detach --no-checkout "$worktree"
    git -C "$worktree" checkout --quiet --orphan "$orphan"
    git -C "$worktree" rm -r --quiet --cached . >/dev/null 2>&1 || true
else
    echo "deploy: cannot read $remote (git ls-remote exited $found)" >&2
    exit 1
fi

# Replace everything but .git with the site; .nojekyll keeps GitHub Pages from hiding
# the theme's directories that start with an underscore.
find "$worktree" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
cp -R "$site/." "$worktree/"
touch "$worktree/.nojekyll"
# --force: the worktree shares the repository's .git/info/exclude, and the user's global
# excludes apply too; a site file they match (*.gz, say) must still be published.
git -C "$worktree" add --all --force

if git -C "$worktree" rev-parse --verify --quiet HEAD >/dev/null \
        && git -C "$worktree" diff --cached --quiet; then
    echo "deploy: the rendered site is unchanged; nothing pushed to $remote $branch"
    exit 0
fi
source_rev=$(git -C "$repo" rev-parse --short HEAD)
# A machine without a git identity (CI) still gets a commit, under the docs' own name.
ident=()
git -C "$worktree" config user.email >/dev/null || ident=(-c user.name="tfcoord docs" -c user.email="docs@tfcoord.invalid")
git -C "$worktree" "${ident[@]}" commit --quiet -m "Documentation site built from $source_rev"
# Pushed from the repository, like ls-remote and fetch above (the worktree shares its
# objects), so every remote operation resolves REMOTE, and a remote configured with a
# relative URL, from the same directory.
commit=$(git -C "$worktree" rev-parse HEAD)
git -C "$repo" push --quiet "$remote" "$commit:refs/heads/$branch"
echo "deploy: pushed $(git -C "$repo" rev-parse --short "$commit") to $remote $branch"
