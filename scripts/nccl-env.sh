# Sourced by the GPU scripts: makes NCCL's runtime findable by stage 08's programs (which
# open libnccl.so.2 at run time) and keeps NVLink multicast (NVLS) off. Where the loader
# already finds libnccl.so.2 nothing is added; otherwise the first copy under python3's
# site-packages (PyTorch's nvidia-nccl-cu13 wheel ships it as nvidia/nccl/lib) or
# $NCCL_ROOT/lib is put on LD_LIBRARY_PATH. Without one, stage 08's tests skip, saying so.
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
flashstep_find_nccl() {
  if ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then return 0; fi
  local dir
  for dir in ${LD_LIBRARY_PATH//:/ }; do [ -e "$dir/libnccl.so.2" ] && return 0; done
  local candidates=()
  [ -n "${NCCL_ROOT:-}" ] && candidates+=("$NCCL_ROOT/lib" "$NCCL_ROOT/lib64")
  if command -v python3 > /dev/null; then
    while IFS= read -r dir; do candidates+=("$dir"); done < <(python3 - 2>/dev/null <<'PY'
import site, sys, glob, os
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + [p for p in sys.path if p]
seen = set()
for root in roots:
    for lib in glob.glob(os.path.join(root, "nvidia", "nccl*", "lib", "libnccl.so.2")) + \
               glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnccl.so.2")):
        d = os.path.dirname(lib)
        if d not in seen:
            seen.add(d)
            print(d)
PY
)
  fi
  for dir in "${candidates[@]}"; do
    if [ -e "$dir/libnccl.so.2" ]; then
      export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "NCCL: $dir/libnccl.so.2"
      return 0
    fi
  done
  echo "NCCL: libnccl.so.2 not found (stage 08 skips); set NCCL_ROOT or LD_LIBRARY_PATH" >&2
  return 1
}
flashstep_find_nccl || true
