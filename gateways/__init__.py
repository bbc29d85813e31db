"""Protocol gateways: agents of other ecosystems reach the kernel through its actions."""
