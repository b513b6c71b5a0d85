"""The model: MiniGPTConfig and MiniGPT (gpt), its options (rotary), sampling, the loss of a batch, the
checkpoint format, the device and precision it runs in, and naming a non-finite output."""
