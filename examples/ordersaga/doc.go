// Command ordersaga runs an order-fulfilment saga: for each order it asks a
// stock service to reserve the goods and a payment service to take the
// money, completes the order when both succeed, and cancels it when either
// fails or the payment has not arrived before a deadline kept by the
// scheduler. A cancelled order is compensated: reserved stock is released,
// and a payment is refunded, even one that arrives after the deadline.
//
//	DATABASE_URL=postgres://… go run ./examples/ordersaga
//
// The stock and payment services are simulated by observers on the same
// client; each order's customer decides how its payment goes (erin pays
// after the deadline, and is refunded).
package main
