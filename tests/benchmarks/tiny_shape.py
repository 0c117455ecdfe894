"""The one-layer model and unit rates the floor and ledger tests price by hand."""

# One layer, hidden 2, one head of width 2: 28 parameters (6 of them the LM head), 56
# weight bytes, 8 KV bytes a token, 8 attention FLOPs a (query, key) pair.
TINY = {
    "hidden_size": 2,
    "intermediate_size": 1,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 2,
    "vocab_size": 3,
}
# One FLOP and one byte a second: a floor in seconds is its FLOPs plus its bytes.
UNIT = {"matmul_flops": 1.0, "copy_bytes_s": 1.0}
