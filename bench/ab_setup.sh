# ab_setup.sh -- sourced by the A/B scripts that time rnicctl builds with
# /usr/bin/time (window_ab.sh, blocking_ab.sh; moderation_ab.sh keeps its
# own checks, which say how to build the rnicctl it runs):
#   ab_setup BINARY...   checks /usr/bin/time and that every BINARY is an
#                        executable (exits with the fix otherwise), makes
#                        $tmp, removed on exit
ab_setup() {
  [ -x /usr/bin/time ] || { echo "/usr/bin/time missing: apt-get install time"; exit 1; }
  for x in "$@"; do [ -x "$x" ] || { echo "$x is not an executable"; exit 1; }; done
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
}
