"""Visual tasks: prompts with images (`Example.meta["images"]`, PIL images) for vision-language models."""
