"""The data stages, in the order the data flows: fetch (WikiText-2 raw, verified), clean, the character
tokenizer, encode (splits to ID arrays), and get_batch over them."""
