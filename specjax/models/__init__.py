from specjax.models.kv_cache import KVCache, LayerKV, read_rows, write_rows
from specjax.models.layers import TransformerConfig
from specjax.models.transformer import Transformer, TransformerOutput, default_feature_layers

__all__ = ["KVCache", "LayerKV", "read_rows", "write_rows", "TransformerConfig", "Transformer",
           "TransformerOutput", "default_feature_layers"]
