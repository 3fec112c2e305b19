# Edits of a copied checkpoint for the CLI and server tests, in bash with jq and dd. Source it; run from the
# repository root.

# tensor_data_offset FILE TENSOR: where the tensor's data begins in a safetensors file, in bytes.
tensor_data_offset() {
  local file=$1 tensor=$2 header_length begin
  header_length=$(od -An -t u8 -N 8 "$file" | tr -d ' ')
  begin=$(head -c $((8 + header_length)) "$file" | tail -c "$header_length" | jq -er --arg t "$tensor" '.[$t].data_offsets[0]') \
    || { echo "no tensor $tensor in $file" >&2; return 1; }
  echo $((8 + header_length + begin))
}

# write_bytes FILE OFFSET BYTES: writes BYTES (printf escapes, e.g. '\x80\x7f') at OFFSET, in place.
write_bytes() { printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }

# set_bf16 FOLDER TENSOR INDEX BYTES: element INDEX of a BF16 tensor of FOLDER/model.safetensors becomes BYTES.
set_bf16() {
  local file=$1/model.safetensors offset
  offset=$(tensor_data_offset "$file" "$2") || return 1
  write_bytes "$file" $((offset + 2 * $3)) "$4"
}

# overflowing_demo FOLDER: a copy of the demo model whose weights are finite but whose logits are not past a
# sequence's first token. Layer 0's conv taps on earlier tokens (the first three of each channel's four) are 3e38
# (BF16 0x7f62), so a token with a predecessor overflows; a first token meets a zero conv tail and computes
# normally (tests/support/overflowing_model.h makes the same model for the C++ tests).
overflowing_demo() {
  local file=$1/model.safetensors offset taps=""
  cp -r models/jambo-demo "$1"
  offset=$(tensor_data_offset "$file" model.layers.0.mamba.conv1d.weight) || return 1
  for _ in $(seq 512); do taps+='\x62\x7f\x62\x7f\x62\x7f\x80\x3f'; done  # the token's own tap is 1
  write_bytes "$file" "$offset" "$taps"
}
