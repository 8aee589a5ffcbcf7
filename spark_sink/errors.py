"""The connector's errors.

LogbusSparkError             anything the connector reports to Spark
├── OptionError              a bad or missing option (raised on the driver, at plan time)
├── DataLossError            offsets the query needs were deleted (retention, truncation,
│                            a deleted topic); see the ``failOnDataLoss`` option
└── BrokerError              the broker answered with an error (``status``, ``code``)
"""

from __future__ import annotations


class LogbusSparkError(Exception):
    pass


class OptionError(LogbusSparkError, ValueError):
    pass


class DataLossError(LogbusSparkError):
    pass


class BrokerError(LogbusSparkError):
    def __init__(self, message: str, *, status: int, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


DATA_LOSS_HINT = (
    "Some data may have been lost because it is no longer available in Logbus: it was deleted "
    "by retention, the partition was truncated or the topic was deleted. If you want your "
    "streaming query to skip such data and go on, set the source option failOnDataLoss to "
    "false."
)
