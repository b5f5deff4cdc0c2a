# Sourced by the set-up scripts (setup_env.sh, setup_vllm_env.sh, setup_bench_env.sh): one way to create a venv and to decide
# whether its install is current (a stamp holding the sha256 of the files the install comes from).
ensure_venv() {  # ensure_venv VENV PYTHON TAG: create VENV with PYTHON unless it exists
  if [ ! -x "$1/bin/python" ]; then
    echo "[$3] creating $1"
    "$2" -m venv "$1"
  fi
}
inputs_hash() {  # inputs_hash FILE...: the sha256 of the files' contents, in order
  cat "$@" | sha256sum | cut -d' ' -f1
}
stamp_is() {  # stamp_is STAMP HASH: true when the install recorded in STAMP came from HASH
  [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]
}
