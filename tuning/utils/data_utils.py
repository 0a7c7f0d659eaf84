"""fms-hf-tuning's template formatting of a ``datasets`` dataset, on our record formatter."""

from tuning.data.formatting import TextFormatter

FORMATTED_DATA_FIELD = "formatted_data_field"


def apply_custom_formatting_template(dataset, template: str, eos_token: str = ""):
    """Add a column holding each record's ``template`` filled from its fields (``{{key}}``), plus ``eos_token``.

    ``dataset`` is a ``Dataset`` or ``DatasetDict``. Returns the mapped dataset and the new column's name. A key that
    a record lacks raises a ``KeyError`` naming it and the record.
    """
    formatter = TextFormatter(eos_token, template=template)

    def format_record(record: dict, index: int) -> dict[str, str]:
        return {FORMATTED_DATA_FIELD: formatter(record, f"record {index} of the dataset")}

    return dataset.map(format_record, with_indices=True), FORMATTED_DATA_FIELD
