"""Error reporting shared by sft_trainer and every wrapper."""


class UserInputError(ValueError):
    """A problem with what the user supplied (arguments, files, data): exits with a user-fault code."""
