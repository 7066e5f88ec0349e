"""Training data: synthetic tokens or local text, as resumable per-rank iterators of Batches."""

from titan_core.data.base import IGNORE_INDEX, Batch, RowLoader
from titan_core.data.loader import SyntheticLoader, build_data_loader
from titan_core.data.text import TextLoader, split_documents
from titan_core.data.tokenizer import BpeTokenizer, ByteTokenizer, build_tokenizer, load_or_train_bpe

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "BpeTokenizer",
    "ByteTokenizer",
    "RowLoader",
    "SyntheticLoader",
    "TextLoader",
    "build_data_loader",
    "build_tokenizer",
    "load_or_train_bpe",
    "split_documents",
]
