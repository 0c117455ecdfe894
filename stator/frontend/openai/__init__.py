"""The OpenAI API: request bodies (`requests`), response objects (`objects`), the
generation routes (`chat`, `completions`, `responses_api`) and server-sent events."""
