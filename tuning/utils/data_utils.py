"""fms-hf-tuning's template formatting of a ``datasets`` dataset, on our record formatter."""

from tuning.data.formatting import TextFormatter

FORMATTED_DATA_FIELD = "formatted_data_field"


def apply_custom_formatting_template(dataset, template: str, eos_token: str = ""):
    """Add a column holding each record's filled ``template`` plus ``eos_token`` to a ``Dataset`` or
    ``DatasetDict``; returns the mapped dataset and the column's name. A missing key is a ``KeyError`` naming it."""
    formatter = TextFormatter(eos_token, template=template)

    def format_record(record: dict, index: int) -> dict[str, str]:
        return {FORMATTED_DATA_FIELD: formatter(record, f"record {index} of the dataset")}

    return dataset.map(format_record, with_indices=True), FORMATTED_DATA_FIELD
